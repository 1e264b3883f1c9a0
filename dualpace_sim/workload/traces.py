"""Loaders for public LLM request traces.

Two formats are read:

* the Azure LLM Inference Trace 2023 (Splitwise; CC-BY 4.0, Patel et al., ISCA 2024):
  ``TIMESTAMP,ContextTokens,GeneratedTokens`` with timestamps like ``2023-11-16 18:17:03.9799600``;
* Vidur's processed traces (e.g. ``data/processed_traces/splitwise_conv.csv``):
  ``num_prefill_tokens,num_decode_tokens`` and optionally ``arrived_at`` (seconds); other columns
  such as ``num_total_tokens`` or ``pd_ratio`` are ignored.

Every problem with a file is reported as a one-line :class:`WorkloadError` that names the file, the
line or column and the fix, because a user replaying a trace needs to know which row to repair.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from dualpace_sim.workload.spec import WorkloadError

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
VIDUR_PROMPT, VIDUR_OUTPUT, VIDUR_ARRIVAL = "num_prefill_tokens", "num_decode_tokens", "arrived_at"


@dataclass(frozen=True)
class TraceRows:
    """Rows of a trace in file order.

    ``timestamps_s`` are seconds relative to the first row, or None for a trace without arrival
    times (then only synthetic arrivals can be used).
    """

    timestamps_s: np.ndarray | None
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    source: str

    def __len__(self) -> int:
        return len(self.prompt_tokens)


def load_azure_trace(path: str | Path, first_n: int | None = None) -> TraceRows:
    """Read the first ``first_n`` rows (all when None) of an Azure LLM Inference Trace 2023 file."""
    path = Path(path)
    df = _read_csv(path, first_n)
    _require_columns(df, path, AZURE_COLUMNS, "an Azure LLM Inference Trace 2023 file")
    return TraceRows(
        timestamps_s=_azure_timestamps(df, path),
        prompt_tokens=_token_counts(df, path, "ContextTokens"),
        output_tokens=_token_counts(df, path, "GeneratedTokens"),
        source=f"azure:{path.name}",
    )


def load_vidur_trace(path: str | Path, first_n: int | None = None) -> TraceRows:
    """Read the first ``first_n`` rows (all when None) of a Vidur processed trace."""
    path = Path(path)
    df = _read_csv(path, first_n)
    _require_columns(df, path, (VIDUR_PROMPT, VIDUR_OUTPUT), "a Vidur processed trace")
    timestamps = _vidur_timestamps(df, path) if VIDUR_ARRIVAL in df.columns else None
    return TraceRows(
        timestamps_s=timestamps,
        prompt_tokens=_token_counts(df, path, VIDUR_PROMPT),
        output_tokens=_token_counts(df, path, VIDUR_OUTPUT),
        source=f"vidur:{path.name}",
    )


def _read_csv(path: Path, first_n: int | None) -> pd.DataFrame:
    """Read cells as text so that every bad value can be reported with its line."""
    if first_n is not None and first_n < 1:
        raise WorkloadError(f"{path}: asked for the first {first_n} rows; ask for at least 1")
    if not path.is_file():
        raise WorkloadError(
            f"{path}: trace file not found; check workload.path (relative paths resolve against "
            "the scenario file's folder)"
        )
    try:
        df = pd.read_csv(path, nrows=first_n, dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, OSError) as exc:
        reason = " ".join(str(exc).split())
        raise WorkloadError(f"{path}: not a readable CSV file ({reason}); check the file") from exc
    df.columns = [str(c).strip() for c in df.columns]
    if df.empty:
        raise WorkloadError(f"{path}: has a header but no data rows; use a non-empty trace")
    if first_n is not None and len(df) < first_n:
        raise WorkloadError(
            f"{path}: has only {len(df)} data rows but the first {first_n} were asked for; "
            f"lower workload.num_requests to at most {len(df)}"
        )
    return df


def _require_columns(df: pd.DataFrame, path: Path, columns: tuple[str, ...], what: str) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise WorkloadError(
            f"{path}: missing column {missing[0]!r} (found: {', '.join(df.columns)}); "
            f"{what} needs the columns {','.join(columns)}"
        )


def _first_bad(bad: np.ndarray) -> int | None:
    return int(np.flatnonzero(bad)[0]) if bad.any() else None


def _line(row: int) -> int:
    """File line of a data row (line 1 is the header)."""
    return row + 2


def _token_counts(df: pd.DataFrame, path: Path, column: str) -> np.ndarray:
    text = df[column].str.strip()
    values = pd.to_numeric(text, errors="coerce").to_numpy(dtype=float)
    with np.errstate(invalid="ignore"):
        bad = ~np.isfinite(values) | (values < 1) | (values != np.round(values))
    row = _first_bad(bad)
    if row is not None:
        raise WorkloadError(
            f"{path}: line {_line(row)}, column {column}: {text.iloc[row]!r} is not a positive "
            "integer token count; fix or delete that row"
        )
    return values.astype(np.int64)


def _check_order(seconds_or_ns: np.ndarray, path: Path, column: str) -> None:
    """Traces are replayed in file order, so out-of-order rows are a corrupted file."""
    row = _first_bad(np.diff(seconds_or_ns) < 0)
    if row is not None:
        raise WorkloadError(
            f"{path}: line {_line(row + 1)}, column {column}: earlier than the previous row; "
            f"sort the file by {column}"
        )


def _azure_timestamps(df: pd.DataFrame, path: Path) -> np.ndarray:
    """Parse to integer nanoseconds so the 7th fractional digit (100 ns) is kept exactly."""
    text = df["TIMESTAMP"].str.strip()
    parsed = pd.to_datetime(text, format="ISO8601", errors="coerce")
    row = _first_bad(parsed.isna().to_numpy())
    if row is not None:
        raise WorkloadError(
            f"{path}: line {_line(row)}, column TIMESTAMP: {text.iloc[row]!r} is not a timestamp "
            "like '2023-11-16 18:17:03.9799600'; fix or delete that row"
        )
    ns = pd.DatetimeIndex(parsed).as_unit("ns").asi8
    _check_order(ns, path, "TIMESTAMP")
    return (ns - ns[0]) / 1e9


def _vidur_timestamps(df: pd.DataFrame, path: Path) -> np.ndarray:
    text = df[VIDUR_ARRIVAL].str.strip()
    seconds = pd.to_numeric(text, errors="coerce").to_numpy(dtype=float)
    row = _first_bad(~np.isfinite(seconds))
    if row is not None:
        raise WorkloadError(
            f"{path}: line {_line(row)}, column {VIDUR_ARRIVAL}: {text.iloc[row]!r} is not a time "
            "in seconds; fix or delete that row"
        )
    _check_order(seconds, path, VIDUR_ARRIVAL)
    return seconds - seconds[0]
