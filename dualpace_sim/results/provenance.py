"""How a result was made, written into every output so that it can be trusted and reproduced.

Every ``summary.json`` entry, ``sweep.json`` and Parquet file (as key-value metadata) carries
:func:`provenance`: the package version, the git commit of the checkout it ran from (with a dirty
flag), a hash of the simulator's own source, the resolved scenario (after defaults, rate and
fitted controls), the profile's hash and provenance, the hashes of the trace file and of the
request list, and the seeds.

:func:`code_version` is what a sweep's resume key holds: the version plus the hash of the
package's source files, so a sweep resumed after a ``git pull`` or a local edit of the simulator
is refused instead of mixing two simulators' numbers. Nothing here reads a clock, so identical
runs still give byte-identical files.
"""

from __future__ import annotations

import functools
import hashlib
import json
import subprocess
from collections.abc import Mapping
from dataclasses import asdict
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as installed_version
from pathlib import Path

from dualpace_sim.config.scenario import LoadedScenario, Scenario, read_scenario
from dualpace_sim.workload import trace_entry
from dualpace_sim.workload.fetch import file_sha256 as streamed_sha256
from dualpace_sim.workload.fetch import local_copy

RUN_PROFILE = "profile.yaml"  # in a real run's directory: the calibration profile it ran with

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # dualpace_sim/

# The Parquet key-value metadata key under which a records file keeps its provenance (JSON).
PARQUET_KEY = "dualpace.provenance"


def package_version() -> str:
    try:
        return installed_version("dualpace")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


@functools.lru_cache(maxsize=1)
def source_hash() -> str:
    """sha256 over the simulator package's Python sources and packaged data, in path order:
    what decides its numbers, whether or not it runs from a git checkout."""
    digest = hashlib.sha256()
    for f in sorted(PACKAGE_DIR.rglob("*")):
        if f.suffix in (".py", ".yaml", ".json") and "__pycache__" not in f.parts:
            data = f.read_bytes()
            digest.update(f"{f.relative_to(PACKAGE_DIR).as_posix()}:{len(data)}:".encode())
            digest.update(data)
    return digest.hexdigest()


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(PACKAGE_DIR), *args], capture_output=True,
                              text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


@functools.lru_cache(maxsize=1)
def git_state() -> dict[str, str | bool | None]:
    """The commit of the checkout the package runs from and whether it has uncommitted changes;
    both None when it is not a git checkout (an installed wheel)."""
    commit = _git("rev-parse", "HEAD")
    if commit is None:
        return {"git_commit": None, "git_dirty": None}
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {"git_commit": commit, "git_dirty": bool(status) if status is not None else None}


def code_version() -> dict[str, str]:
    """The simulator's identity for resume keys: version and source hash."""
    return {"version": package_version(), "source_sha256": source_hash()}


def describe_version(v: dict | None) -> str:
    """``dualpace 0.1.0 (source 3f2a9c1d)`` for messages; "an unrecorded version" for None."""
    if not v:
        return "an unrecorded version"
    return f"dualpace {v.get('version')} (source {str(v.get('source_sha256'))[:8]})"


def _resolve(base: Path, name: str) -> Path:
    p = Path(name).expanduser()
    return p if p.is_absolute() else base / p


def referenced_files(path: Path, spec: Scenario) -> list[Path]:
    """The files besides the scenario whose bytes decide the results: the calibration profile
    (or the roofline's hardware spec / model config when given as paths) and a trace file."""
    base = path.parent
    files = []
    if spec.profile is not None:
        files.append(_resolve(base, spec.profile))
    if spec.roofline is not None:
        if spec.roofline.hardware.endswith((".yaml", ".yml")):
            files.append(_resolve(base, spec.roofline.hardware))
        if spec.roofline.model.endswith(".json"):
            files.append(_resolve(base, spec.roofline.model))
    if spec.workload.path is not None:
        files.append(_resolve(base, spec.workload.path))
    return files


def scenario_hash(path: Path | str, changes: Mapping | None = None) -> str:
    """sha256 over the scenario file's bytes, those of the files it refers to, and the
    ``changes`` laid over it (``--set``), so that any of them changing changes the hash."""
    path = Path(path)
    digest = hashlib.sha256()
    for f in [path, *referenced_files(path, read_scenario(path, changes))]:
        data = f.read_bytes() if f.is_file() else b""
        digest.update(f"{len(data)}:".encode())
        digest.update(data)
    if changes:
        digest.update(json.dumps(changes, sort_keys=True, default=str).encode())
    return digest.hexdigest()


def file_sha256(path: Path) -> str | None:
    """sha256 of a file (None when there is none), computed once per process for each size
    and modification time: a sweep's points share their trace."""
    if not path.is_file():
        return None
    stat = path.stat()
    return _hashed(str(path.resolve()), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _hashed(path: str, size: int, mtime_ns: int) -> str:
    return streamed_sha256(Path(path))


def requests_sha256(loaded: LoadedScenario) -> str:
    """sha256 of the request list (arrival, prompt and output length of each), which pins the
    workload whatever its source: a trace file, a download or the seeded default sampler."""
    digest = hashlib.sha256()
    for r in loaded.requests:
        digest.update(f"{r.arrival_s!r},{r.prompt_tokens},{r.max_tokens};".encode())
    return digest.hexdigest()


def resolved_scenario(loaded: LoadedScenario) -> dict:
    """The scenario as it ran: its fields after defaults and the rate, with ``scheduler`` the
    resolved DualPace configuration (pool sizes from the profile, controls from the fit) and
    ``neo.launch_s`` the launch term used."""
    spec = loaded.spec.model_dump(mode="json")
    spec["scheduler"] = {**spec["scheduler"], **asdict(loaded.config)}
    spec["neo"]["launch_s"] = loaded.neo_launch_s
    return spec


def profile_record(loaded: LoadedScenario) -> dict:
    """The profile's source, hash (of its file, else of its contents) and provenance."""
    source = Path(loaded.profile_source)
    digest = file_sha256(source) if source.is_file() else None
    if digest is None:
        digest = hashlib.sha256(loaded.profile.model_dump_json().encode()).hexdigest()
    return {"source": loaded.profile_source, "sha256": digest,
            "model": loaded.profile.model.name, "box": loaded.profile.box.name,
            **loaded.profile.provenance.model_dump(mode="json")}


def trace_file(loaded: LoadedScenario) -> Path | None:
    """The trace file a workload replays: its path, or the local copy of a registered or
    downloaded trace; None for the default and synthetic samplers (pinned by the request hash)."""
    w = loaded.spec.workload
    if w.path is not None:
        return _resolve(loaded.path.parent, w.path)
    if w.source in ("default", "synthetic"):
        return None
    name = w.trace if w.source == "trace" else f"azure-2023-{w.trace}"
    return local_copy(trace_entry(name))


def provenance(loaded: LoadedScenario) -> dict:
    """Everything :mod:`provenance` promises about one loaded scenario; JSON-ready."""
    trace = trace_file(loaded)
    return {
        "package": "dualpace",
        **code_version(),
        **git_state(),
        "scenario_path": str(loaded.path.resolve()),
        "scenario": resolved_scenario(loaded),
        "profile": profile_record(loaded),
        "trace": {"path": str(trace) if trace else None,
                  "sha256": file_sha256(trace) if trace else None},
        "requests_sha256": requests_sha256(loaded),
        "seeds": {"workload": loaded.spec.workload.seed},
    }


def parquet_metadata(record: dict) -> dict[bytes, bytes]:
    """Key-value metadata for a records file: the provenance as JSON under :data:`PARQUET_KEY`."""
    return {PARQUET_KEY.encode(): json.dumps(record, sort_keys=True).encode()}
