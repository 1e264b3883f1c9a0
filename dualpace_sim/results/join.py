"""One run directory from runs of one scenario's policies made in separate folders.

A box's time limit often splits a comparison: DualPace served in one call (or one session),
vLLM in another, each into its own `--out`. `dualpace-sim validate` and the rankings compare
the policies of one directory, so this joins them as `dualpace-hw run --policy` into one
folder would have:

    python -m dualpace_sim.results.join OUT RUN_A RUN_B [...] [--take POLICY=RUN ...]

Each policy comes from the one run that holds it (`--take` says which, where several do): its
records, series, summary and files (journal, assists, CPU steps) land in OUT as its run wrote
them. The runs must be of one scenario's requests (the summaries' scenario name and
request-list hash); a note says when the scenario file or a file it names (its profile) changed
between them. OUT keeps the first run's `profile.yaml` (the one `validate` prices with unless
`--costs` is given); a note names every run that ran with another profile, since its policy's
decisions were that profile's.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq

from dualpace_sim.results.node_series import read_series, write_series
from dualpace_sim.results.outputs import write_json
from dualpace_sim.results.provenance import RUN_PROFILE
from dualpace_sim.results.records import read_records, write_records

RECORDS, SUMMARY = "requests.parquet", "summary.json"
# Files of one policy beside the shared ones: the journal, DualPace's assists and CPU steps.
POLICY_FILES = ("journal-{policy}.jsonl.gz", "assists-{policy}.csv.gz",
                "cpu-steps-{policy}.csv.gz")


class JoinError(ValueError):
    """A run that cannot be joined: the message names the folder, the field and the fix."""


def read_summaries(run: Path) -> list[dict]:
    path = run / SUMMARY
    try:
        summaries = json.loads(path.read_text())
    except OSError:
        raise JoinError(f"{path}: missing; give a run directory (dualpace-hw run --out)") from None
    except ValueError as e:
        raise JoinError(f"{path}: not readable JSON ({e}); rerun that run") from None
    if not isinstance(summaries, list) or not all(isinstance(s, dict) and "policy" in s
                                                  for s in summaries):
        raise JoinError(f"{path}: not a list of policy summaries; rerun that run")
    return summaries


def owners(runs: list[Path], summaries: list[list[dict]],
           take: dict[str, Path]) -> dict[str, Path]:
    """policy -> the run it is taken from: the one run that holds it, or the run `take`
    names for it where several do."""
    holders: dict[str, list[Path]] = {}
    for run, ss in zip(runs, summaries, strict=True):
        for s in ss:
            holders.setdefault(s["policy"], []).append(run)
    chosen = {}
    for policy, held in holders.items():
        if policy in take:
            if not any(take[policy].resolve() == r.resolve() for r in held):
                raise JoinError(f"--take {policy}={take[policy]}: that run has no {policy}; "
                                f"name one of {', '.join(map(str, held))}")
            chosen[policy] = take[policy]
        elif len(held) > 1:
            raise JoinError(f"policy {policy} is in {' and '.join(map(str, held))}; say which "
                            f"with --take {policy}=RUN")
        else:
            chosen[policy] = held[0]
    unknown = sorted(set(take) - set(holders))
    if unknown:
        raise JoinError(f"--take {unknown[0]}: no run holds that policy")
    return chosen


def join_runs(out: Path, runs: list[Path], take: dict[str, Path] | None = None) -> list[str]:
    """Join `runs` into `out` (created; must not be one of them), each policy from the run
    that holds it (or the one `take` names), and return the notes to print. Raises JoinError
    on runs of different scenarios or a policy in several runs that `take` does not settle."""
    if len(runs) < 2:
        raise JoinError("give at least two run directories to join")
    if any(out.resolve() == r.resolve() for r in runs):
        raise JoinError(f"{out}: is one of the runs; give a new folder for the joined run")
    summaries = [read_summaries(r) for r in runs]
    same = {(s.get("scenario"), s.get("provenance", {}).get("requests_sha256"))
            for ss in summaries for s in ss}
    if len(same) != 1:
        raise JoinError(f"{', '.join(map(str, runs))}: their summary.json files differ in "
                        "scenario or provenance.requests_sha256 (runs of different scenarios "
                        "or request lists); join runs of one scenario's requests")
    chosen = owners(runs, summaries, take or {})
    out.mkdir(parents=True, exist_ok=True)
    frames, series, kept, metadata = [], {}, [], None
    for run, ss in zip(runs, summaries, strict=True):
        mine = [s["policy"] for s in ss if chosen[s["policy"]] == run]
        if not mine:
            continue
        try:
            records = read_records(run / RECORDS)
            run_series = read_series(run)
        except OSError as e:  # pyarrow's: a missing or truncated file
            raise JoinError(f"{run / RECORDS}: not readable ({e}); rerun that run") from None
        except ValueError as e:
            raise JoinError(str(e)) from None
        frames.append(records[records["policy"].isin(mine)])
        series.update({p: v for p, v in run_series.items() if p in mine})
        kept.extend(s for s in ss if s["policy"] in mine)
        if metadata is None:
            metadata = pq.read_schema(run / RECORDS).metadata
        for policy in mine:
            for name in POLICY_FILES:
                src = run / name.format(policy=policy)
                if src.is_file():
                    shutil.copyfile(src, out / src.name)
    write_records(pd.concat(frames, ignore_index=True), out / RECORDS, metadata)
    if series:
        write_series(series, out, metadata)
    write_json(out / SUMMARY, kept)
    notes = []
    if len({s.get("scenario_hash") for s in kept}) > 1:
        notes.append("note: the runs' scenario_hash differ: the scenario file or a file it "
                     "names (its profile, its trace) changed between them")
    first = runs[0] / RUN_PROFILE
    if first.is_file():
        shutil.copyfile(first, out / RUN_PROFILE)
        for run in runs[1:]:
            other = run / RUN_PROFILE
            if not other.is_file() or other.read_bytes() != first.read_bytes():
                notes.append(f"note: {run} ran with another profile than {first} (kept in "
                             f"{out / RUN_PROFILE}); its policy's decisions were that profile's")
    return notes


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the joined run's directory")
    parser.add_argument("runs", nargs="+", type=Path, help="run directories, of one scenario")
    parser.add_argument("--take", action="append", default=[], metavar="POLICY=RUN",
                        help="the run a policy held by several runs is taken from (repeat)")
    args = parser.parse_args(argv)
    try:
        take = {}
        for item in args.take:
            policy, sep, run = item.partition("=")
            if not sep or not policy or not run:
                raise JoinError(f"--take {item}: give POLICY=RUN, e.g. vllm=runs/vllm-r4")
            take[policy] = Path(run)
        notes = join_runs(args.out, args.runs, take)
    except JoinError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    for note in notes:
        print(note)
    print(f"joined {len(args.runs)} runs in {args.out}/")


if __name__ == "__main__":
    main()
