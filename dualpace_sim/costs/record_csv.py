"""The CSV side of the runtime's per-event records (assists, CPU steps): one header row naming
the columns as `dualpace-hw run` writes them, then one row per event; a file that cannot be
read, or a row of the wrong width, is refused in one line naming the file and the line.

The runtime writes them gzip-compressed (`.csv.gz`: a served run's assists are megabytes of
text, and the validation set keeps them); runtimes before session 20 wrote plain `.csv`,
which `record_file` still finds."""

from __future__ import annotations

import csv
import gzip
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path


def record_file(run_dir: Path, template: str, policy: str) -> Path:
    """A run directory's record of `template` ("assists-{policy}.csv.gz", say) for `policy`:
    the compressed file, or the plain `.csv` an earlier runtime wrote where only that exists
    (the compressed name where neither does, for the caller's "no such record")."""
    path = Path(run_dir) / template.format(policy=policy)
    plain = path.with_suffix("")
    return plain if not path.is_file() and plain.is_file() else path


def _open(path: Path, mode: str):
    """Text mode, gzip-compressed where the name ends in .gz."""
    if Path(path).suffix == ".gz":
        return gzip.open(path, mode + "t", newline="")
    return open(path, mode, newline="")


def write_rows(path: Path, columns: Sequence[str], rows: Iterable[Sequence[object]]) -> None:
    """Floats with 9 significant digits, everything else as it prints."""
    with _open(path, "w") as f:
        w = csv.writer(f)
        w.writerow(columns)
        for row in rows:
            w.writerow([f"{v:.9g}" if isinstance(v, float) else v for v in row])


def read_rows(path: Path, columns: Sequence[str], error: type[ValueError]
              ) -> Iterator[tuple[int, list[str]]]:
    """(line number, fields) of each data row, after checking the header and each width;
    `error` (the record's own exception) on a file that fails them."""
    try:
        with _open(path, "r") as f:
            rows = list(csv.reader(f))
    except (OSError, EOFError, UnicodeDecodeError, csv.Error) as e:
        raise error(f"{path}: cannot read it ({e})") from None
    if not rows or tuple(rows[0]) != tuple(columns):
        raise error(f"{path}: the header must be {','.join(columns)}, as `dualpace-hw run` "
                    "writes")
    for line, row in enumerate(rows[1:], start=2):
        if len(row) != len(columns):
            raise error(f"{path}:{line}: {len(row)} fields, want {len(columns)}")
        yield line, row
