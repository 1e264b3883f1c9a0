"""Loaders for public LLM request traces.

Three formats are read:

* the Azure LLM Inference Trace 2023 (Splitwise; CC-BY 4.0, Patel et al., ISCA 2024):
  ``TIMESTAMP,ContextTokens,GeneratedTokens`` with timestamps like ``2023-11-16 18:17:03.9799600``;
* Vidur's processed traces (e.g. ``data/processed_traces/splitwise_conv.csv``):
  ``num_prefill_tokens,num_decode_tokens`` and optionally ``arrived_at`` (seconds); other columns
  such as ``num_total_tokens`` or ``pd_ratio`` are ignored;
* Mooncake's JSON-lines traces (kvcache-ai/Mooncake, FAST'25): one object per line with
  ``timestamp`` (milliseconds), ``input_length`` and ``output_length``; ``hash_ids`` (prefix-cache
  block ids) are ignored because the simulated node has no prefix cache.

The 2024 week-long Azure traces have the 2023 columns with time-zone offsets
(``2024-05-10 00:00:00.009930+00:00``), which the Azure loader reads as well.

Every problem with a file is reported as a one-line :class:`WorkloadError` that names the file, the
line or column and the fix, because a user replaying a trace needs to know which row to repair.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from dualpace_sim.common.inputs import InputFileError, check_regular_file
from dualpace_sim.workload.spec import WorkloadError

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
VIDUR_PROMPT, VIDUR_OUTPUT, VIDUR_ARRIVAL = "num_prefill_tokens", "num_decode_tokens", "arrived_at"
MOONCAKE_KEYS = ("timestamp", "input_length", "output_length")


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
    timestamps = (_numeric_timestamps(df, path, VIDUR_ARRIVAL, "seconds", 1.0)
                  if VIDUR_ARRIVAL in df.columns else None)
    return TraceRows(
        timestamps_s=timestamps,
        prompt_tokens=_token_counts(df, path, VIDUR_PROMPT),
        output_tokens=_token_counts(df, path, VIDUR_OUTPUT),
        source=f"vidur:{path.name}",
    )


def load_mooncake_trace(path: str | Path, first_n: int | None = None) -> TraceRows:
    """Read the first ``first_n`` requests (all when None) of a Mooncake JSON-lines trace."""
    path = Path(path)
    df = _read_jsonl(path, first_n)
    _require_columns(df, path, MOONCAKE_KEYS, "a Mooncake trace")
    df = df[list(MOONCAKE_KEYS)].astype("string").fillna("")  # text cells, as from a CSV
    return TraceRows(
        timestamps_s=_numeric_timestamps(df, path, "timestamp", "milliseconds", 1e-3),
        prompt_tokens=_token_counts(df, path, "input_length"),
        output_tokens=_token_counts(df, path, "output_length"),
        source=f"mooncake:{path.name}",
    )


TraceLoader = Callable[..., TraceRows]
LOADERS: dict[str, TraceLoader] = {
    "azure": load_azure_trace, "vidur": load_vidur_trace, "mooncake": load_mooncake_trace,
}
"""Loader per file format; the names are the ``workload.source`` values that take a path."""


def _check_request(path: Path, first_n: int | None) -> None:
    if first_n is not None and first_n < 1:
        raise WorkloadError(f"{path}: asked for the first {first_n} rows; ask for at least 1")
    if not path.exists():
        raise WorkloadError(
            f"{path}: trace file not found; check workload.path (relative paths resolve against "
            "the scenario file's folder)"
        )
    try:  # only the first rows are read, so a trace of any size will do
        check_regular_file(path, "trace file", limit=None)
    except InputFileError as e:
        raise WorkloadError(str(e)) from None


def _read_csv(path: Path, first_n: int | None) -> pd.DataFrame:
    """Read cells as text so that every bad value can be reported with its line.

    The index holds file line numbers (line 1 is the header).
    """
    _check_request(path, first_n)
    try:
        df = pd.read_csv(path, nrows=first_n, dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, OSError) as exc:
        reason = " ".join(str(exc).split())
        raise WorkloadError(f"{path}: not a readable CSV file ({reason}); check the file") from exc
    df.columns = [str(c).strip() for c in df.columns]
    df.index = np.arange(2, len(df) + 2)
    if df.empty:
        raise WorkloadError(f"{path}: has a header but no data rows; use a non-empty trace")
    _check_length(df, path, first_n)
    return df


def _read_jsonl(path: Path, first_n: int | None) -> pd.DataFrame:
    """Read one JSON object per line into a frame indexed by file line number."""
    _check_request(path, first_n)
    records, lines = [], []
    try:
        with path.open(encoding="utf-8") as f:
            for number, text in enumerate(f, start=1):
                if len(records) == first_n:
                    break
                if not text.strip():
                    continue
                try:
                    record = json.loads(text)
                except json.JSONDecodeError as exc:
                    raise WorkloadError(f"{path}: line {number}: not valid JSON ({exc.msg}); fix "
                                        "or delete that line") from exc
                if not isinstance(record, dict):
                    raise WorkloadError(f"{path}: line {number}: not a JSON object; each line "
                                        f"needs the keys {', '.join(MOONCAKE_KEYS)}")
                records.append(record)
                lines.append(number)
    except (OSError, UnicodeDecodeError) as exc:
        reason = " ".join(str(exc).split())
        raise WorkloadError(f"{path}: not a readable JSON-lines file ({reason}); check the "
                            "file") from exc
    if not records:
        raise WorkloadError(f"{path}: has no requests; use a non-empty trace")
    df = pd.DataFrame.from_records(records, index=lines)
    _check_length(df, path, first_n)
    return df


def _check_length(df: pd.DataFrame, path: Path, first_n: int | None) -> None:
    if first_n is not None and len(df) < first_n:
        raise WorkloadError(
            f"{path}: has only {len(df)} data rows but the first {first_n} were asked for; "
            f"lower workload.num_requests to at most {len(df)}"
        )


def _require_columns(df: pd.DataFrame, path: Path, columns: tuple[str, ...], what: str) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise WorkloadError(
            f"{path}: missing column {missing[0]!r} (found: {', '.join(df.columns)}); "
            f"{what} needs the columns {','.join(columns)}"
        )


def _first_bad(bad: np.ndarray) -> int | None:
    return int(np.flatnonzero(bad)[0]) if bad.any() else None


def _token_counts(df: pd.DataFrame, path: Path, column: str) -> np.ndarray:
    text = df[column].str.strip()
    values = pd.to_numeric(text, errors="coerce").to_numpy(dtype=float)
    with np.errstate(invalid="ignore"):
        bad = ~np.isfinite(values) | (values < 1) | (values != np.round(values))
    row = _first_bad(bad)
    if row is not None:
        raise WorkloadError(
            f"{path}: line {df.index[row]}, column {column}: {text.iloc[row]!r} is not a positive "
            "integer token count; fix or delete that row"
        )
    return values.astype(np.int64)


def _check_order(times: np.ndarray, df: pd.DataFrame, path: Path, column: str) -> None:
    """Traces are replayed in file order, so out-of-order rows are a corrupted file."""
    row = _first_bad(np.diff(times) < 0)
    if row is not None:
        raise WorkloadError(
            f"{path}: line {df.index[row + 1]}, column {column}: earlier than the previous row; "
            f"sort the file by {column}"
        )


def _azure_timestamps(df: pd.DataFrame, path: Path) -> np.ndarray:
    """Parse to integer nanoseconds so the 7th fractional digit (100 ns) is kept exactly."""
    text = df["TIMESTAMP"].str.strip()
    try:
        parsed = pd.to_datetime(text, format="ISO8601", errors="coerce")
    except ValueError:  # pandas refuses offsets that differ from row to row
        offsets = text.str.extract(r"([+-]\d\d:?\d\d|Z)$")[0].fillna("")
        row = _first_bad((offsets != offsets.iloc[0]).to_numpy())
        line = df.index[row] if row is not None else df.index[0]
        raise WorkloadError(
            f"{path}: line {line}, column TIMESTAMP: {text.loc[line]!r} has a different time-zone "
            f"offset from line {df.index[0]}'s {text.iloc[0]!r}; give every row the same offset "
            "(or none)") from None
    row = _first_bad(parsed.isna().to_numpy())
    if row is not None:
        raise WorkloadError(
            f"{path}: line {df.index[row]}, column TIMESTAMP: {text.iloc[row]!r} is not a "
            "timestamp like '2023-11-16 18:17:03.9799600'; fix or delete that row"
        )
    ns = pd.DatetimeIndex(parsed).as_unit("ns").asi8
    _check_order(ns, df, path, "TIMESTAMP")
    return (ns - ns[0]) / 1e9


def _numeric_timestamps(df: pd.DataFrame, path: Path, column: str, unit: str,
                        seconds_per_unit: float) -> np.ndarray:
    text = df[column].str.strip()
    times = pd.to_numeric(text, errors="coerce").to_numpy(dtype=float)
    row = _first_bad(~np.isfinite(times))
    if row is not None:
        raise WorkloadError(
            f"{path}: line {df.index[row]}, column {column}: {text.iloc[row]!r} is not a time "
            f"in {unit}; fix or delete that row"
        )
    _check_order(times, df, path, column)
    return (times - times[0]) * seconds_per_unit
