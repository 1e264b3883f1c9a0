"""What the node held over time, rebuilt from the per-request records: queue lengths and the
KV blocks requests hold on each tier.

The records keep every token time and every migration, so these series need no extra
bookkeeping in the simulator (or the real runtime). ``waiting`` counts requests that have
arrived and produced no token yet (queued or prefilling), ``decoding`` those between their
first and last token. A request's KV is counted from its first token until its last frees it, as
``ceil((prompt + tokens so far) / block_size)`` blocks, on the host after a Prefill-to-CPU copy
or a swap-out and in HBM otherwise, and not at all from a recompute preemption to the next
token; blocks reserved ahead of growth and chunks of a prefill
still in flight are not in the records, so the pools' own occupancy can be somewhat higher.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

SERIES_POINTS = 1000
_ON_HOST = ("prefill_to_cpu", "swap_out")


def state_series(df: pd.DataFrame, block_size: int, points: int = SERIES_POINTS) -> pd.DataFrame:
    """Columns ``time_s, waiting, decoding, gpu_kv_blocks, host_kv_blocks`` at ``points``
    evenly spaced times from 0 to the last token (one policy's records)."""
    finish = df["finish_s"].to_numpy(dtype=float)
    end = float(np.nanmax(finish)) if np.isfinite(finish).any() else 0.0
    times = np.linspace(0.0, end, points)
    arrived = np.searchsorted(np.sort(df["arrival_s"].to_numpy(dtype=float)), times, "right")
    first = df["first_token_s"].to_numpy(dtype=float)
    started = np.searchsorted(np.sort(first[np.isfinite(first)]), times, "right")
    done = np.searchsorted(np.sort(finish[np.isfinite(finish)]), times, "right")
    gpu = np.zeros(points, dtype=np.int64)
    host = np.zeros(points, dtype=np.int64)
    for prompt, tokens, kinds, moves in zip(df["prompt_tokens"], df["token_times_s"],
                                            df["migration_kinds"], df["migration_times_s"],
                                            strict=True):
        if len(tokens) == 0:
            continue
        tokens = np.asarray(tokens, dtype=float)
        held = (times >= tokens[0]) & (times < tokens[-1])  # freed with the last token
        blocks = -(-(int(prompt) + np.searchsorted(tokens, times, "right")) // block_size)
        blocks = np.where(held, blocks, 0)
        on_host = np.zeros(points, dtype=bool)
        if len(moves):
            order = np.argsort(np.asarray(moves, dtype=float), kind="stable")
            moves = np.asarray(moves, dtype=float)[order]
            kinds = np.asarray(kinds)[order]
            for at in moves[kinds == "preempt_recompute"]:  # KV dropped until recomputed
                resume = np.searchsorted(tokens, at, "right")
                until = tokens[resume] if resume < len(tokens) else np.inf
                blocks = np.where((times >= at) & (times < until), 0, blocks)
            to_host = np.isin(kinds, _ON_HOST)
            last = np.searchsorted(moves, times, "right") - 1
            on_host = np.where(last >= 0, to_host[np.maximum(last, 0)], False)
        host += np.where(on_host, blocks, 0)
        gpu += np.where(on_host, 0, blocks)
    return pd.DataFrame({"time_s": times, "waiting": arrived - started,
                         "decoding": started - done, "gpu_kv_blocks": gpu,
                         "host_kv_blocks": host})
