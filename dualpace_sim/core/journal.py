"""A backend's journal of the core calls it made, in order, with their clock times.

The real runtime records every call it makes into the shared core (arrivals, each engine's
schedule/commit, the completions of copies and migrations, each apply) under the lock that
serializes them, so the journal is the total order in which the core saw its inputs. Replaying
it (`dualpace_sim.results.replay`) through fresh schedulers on the simulator's clock must reproduce
every recorded plan: the proof that the runtime decides nothing outside the core.

Plans are recorded as `describe_*` summaries: request ids and sizes only, JSON-friendly.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .neo import NeoPlan
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


def describe_neo(plan: NeoPlan) -> dict:
    """A NEO iteration: its swaps and, per sub-batch (none, one GPU-only or two pipelined),
    [GPU prefills, CPU prefills, GPU decodes, CPU decodes]."""
    return {
        "swap_outs": _ids(plan.swap_outs), "swap_ins": _ids(plan.swap_ins),
        "batches": [[_ids(b.gpu_prefills), _ids(b.cpu_prefills), _ids(b.gpu_decodes),
                     _ids(b.cpu_decodes)] for b in plan.batches],
    }


@dataclass(slots=True)
class Entry:
    """One core call: `engine` made `call` at clock time `t`; `data` holds its arguments
    (request ids, tokens) or, for a schedule, the plan it got."""

    t: float
    engine: str  # "load", "gpu" or "cpu"
    call: str  # submit, schedule, copies_done, migrations_done, apply
    data: dict = field(default_factory=dict)


# The calls a backend makes, per engine; a journal naming another is not one of ours.
CALLS = {"load": ("submit",),
         "gpu": ("schedule", "copies_done", "migrations_done", "apply"),
         "cpu": ("schedule", "apply")}


class JournalError(ValueError):
    """A journal file that cannot be read back; one line naming the file, the line and why."""


class Journal:
    def __init__(self, source: str = "journal") -> None:
        self.entries: list[Entry] = []
        self.source = source  # where it was read from, for error messages

    def record(self, t: float, engine: str, call: str, **data) -> None:
        self.entries.append(Entry(t, engine, call, data))

    def write(self, path: Path) -> None:
        with gzip.open(path, "wt") as f:
            for e in self.entries:
                f.write(json.dumps(asdict(e)) + "\n")

    @classmethod
    def read(cls, path: Path) -> Journal:
        """Read a journal :meth:`write` wrote; JournalError for a file that is not gzip, is cut
        short (a run killed while writing it) or holds a line that is not one entry."""
        journal = cls(str(path))
        try:
            with gzip.open(path, "rt", encoding="utf-8") as f:
                for line in f:
                    journal.entries.append(_entry(json.loads(line)))
        except (gzip.BadGzipFile, EOFError, UnicodeDecodeError, OSError) as e:
            reason = ("cut short (was its run killed?)" if isinstance(e, EOFError) else
                      f"not a gzip-compressed journal ({e})")
            raise JournalError(f"{path}: {reason}; rerun the real run to write it again") from None
        except json.JSONDecodeError as e:
            line = len(journal.entries) + 1
            raise JournalError(f"{path}: line {line}: not JSON ({e.msg})") from None
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            line = len(journal.entries) + 1
            raise JournalError(f"{path}: line {line}: not a journal entry ({e})") from None
        return journal


def _entry(d: object) -> Entry:
    """One entry from its JSON object, checked: KeyError, TypeError or ValueError if not."""
    if not isinstance(d, dict):
        raise TypeError("expected an object")
    t, engine, call, data = d["t"], d["engine"], d["call"], d["data"]
    if not isinstance(t, int | float) or isinstance(t, bool) or not isinstance(data, dict):
        raise TypeError("t must be a number and data an object")
    if call not in CALLS.get(engine, ()):
        raise ValueError(f"unknown call {engine}/{call}")
    data = {k: _int_keys(v) if k == "tokens" else v for k, v in data.items()}
    return Entry(float(t), engine, call, data)


def _int_keys(tokens: dict) -> dict[int, int]:
    """JSON turns the req_id keys of a tokens dict into strings; turn them back."""
    return {int(k): v for k, v in tokens.items()}
