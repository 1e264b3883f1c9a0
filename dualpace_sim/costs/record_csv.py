"""The CSV side of the runtime's per-event records (assists, CPU steps): one header row naming
the columns as `dualpace-hw run` writes them, then one row per event; a file that cannot be
read, or a row of the wrong width, is refused in one line naming the file and the line."""

from __future__ import annotations

import csv
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path


def write_rows(path: Path, columns: Sequence[str], rows: Iterable[Sequence[object]]) -> None:
    """Floats with 9 significant digits, everything else as it prints."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(columns)
        for row in rows:
            w.writerow([f"{v:.9g}" if isinstance(v, float) else v for v in row])


def read_rows(path: Path, columns: Sequence[str], error: type[ValueError]
              ) -> Iterator[tuple[int, list[str]]]:
    """(line number, fields) of each data row, after checking the header and each width;
    `error` (the record's own exception) on a file that fails them."""
    try:
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise error(f"{path}: cannot read it ({e})") from None
    if not rows or tuple(rows[0]) != tuple(columns):
        raise error(f"{path}: the header must be {','.join(columns)}, as `dualpace-hw run` "
                    "writes")
    for line, row in enumerate(rows[1:], start=2):
        if len(row) != len(columns):
            raise error(f"{path}:{line}: {len(row)} fields, want {len(columns)}")
        yield line, row
