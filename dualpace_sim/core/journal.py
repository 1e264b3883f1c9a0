"""A backend's journal of the core calls it made, in order, with their clock times.

The real runtime records every call it makes into the shared core (arrivals, each engine's
schedule/commit, the completions of copies and migrations, each apply) under the lock that
serializes them, so the journal is the total order in which the core saw its inputs. Replaying
it (`dualpace_sim.replay`) through fresh schedulers on the simulator's clock must reproduce
every recorded plan: the proof that the runtime decides nothing outside the core.

Plans are recorded as `describe_*` summaries: request ids and sizes only, JSON-friendly.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .plans import CpuPlan, GpuPlan

JOURNAL_FILE = "journal-{policy}.jsonl.gz"  # gzip: a minute of serving is ~10^5 calls


def _ids(reqs) -> list[int]:
    return [r.req_id for r in reqs]


def describe_gpu(plan: GpuPlan) -> dict:
    return {
        "swap_outs": _ids(plan.swap_outs), "swap_ins": _ids(plan.swap_ins),
        "decodes": _ids(plan.decodes),
        "prefills": [[c.req.req_id, c.start, c.tokens, c.to_cpu, c.last] for c in plan.prefills],
        "marks": _ids(plan.marks), "wait_for_copies": plan.wait_for_copies,
    }


def describe_cpu(plan: CpuPlan) -> dict:
    return {"batch": _ids(plan.batch), "route": plan.route.value,
            "held_back": _ids(plan.held_back), "admitted": plan.admitted}


@dataclass(slots=True)
class Entry:
    """One core call: `engine` made `call` at clock time `t`; `data` holds its arguments
    (request ids, tokens) or, for a schedule, the plan it got."""

    t: float
    engine: str  # "load", "gpu" or "cpu"
    call: str  # submit, schedule, copies_done, migrations_done, apply
    data: dict = field(default_factory=dict)


class Journal:
    def __init__(self) -> None:
        self.entries: list[Entry] = []

    def record(self, t: float, engine: str, call: str, **data) -> None:
        self.entries.append(Entry(t, engine, call, data))

    def write(self, path: Path) -> None:
        with gzip.open(path, "wt") as f:
            for e in self.entries:
                f.write(json.dumps(asdict(e)) + "\n")

    @classmethod
    def read(cls, path: Path) -> Journal:
        journal = cls()
        with gzip.open(path, "rt") as f:
            for line in f:
                d = json.loads(line)
                d["data"] = {k: _int_keys(v) if k == "tokens" else v
                             for k, v in d["data"].items()}
                journal.entries.append(Entry(**d))
        return journal


def _int_keys(tokens: dict) -> dict[int, int]:
    """JSON turns the req_id keys of a tokens dict into strings; turn them back."""
    return {int(k): v for k, v in tokens.items()}
