"""Find or download the public traces of ``registry.py`` into a per-user cache.

The project may not redistribute the traces, so users get them from upstream once and keep them in
``~/.cache/dualpace/traces/<name>/``. Files with a pinned sha256 are checked against it: replaying
a silently changed trace would make results incomparable with earlier runs. Unpinned files are
taken as downloaded; ``dualpace-sim traces fetch`` prints their hash so it can be compared and
pinned.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import urllib.request
from pathlib import Path

from dualpace_sim.common.progress import progress_bar
from dualpace_sim.workload.registry import TraceEntry, trace_entry
from dualpace_sim.workload.spec import WorkloadError

AZURE_DIR_ENV = "DUALPACE_AZURE_DIR"
"""A folder holding the Azure 2023 files under their upstream names; used as is, before the cache
(tests and the device machines keep a shared copy there)."""
AZURE_2023 = ("azure-2023-conv", "azure-2023-code")
CHUNK_BYTES = 1 << 20


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/dualpace/traces``, i.e. ``~/.cache/dualpace/traces`` on most systems."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "dualpace" / "traces"


def cache_path(entry: TraceEntry, cache_dir: Path | None = None) -> Path:
    """Where ``entry`` is (or will be) kept in the cache."""
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return cache / entry.name / entry.file_name


def local_copy(entry: TraceEntry, cache_dir: Path | None = None) -> Path | None:
    """The copy already on this machine ($DUALPACE_AZURE_DIR, then the cache), unverified."""
    env_dir = os.environ.get(AZURE_DIR_ENV)
    if entry.name in AZURE_2023 and env_dir and (Path(env_dir) / entry.file_name).is_file():
        return Path(env_dir) / entry.file_name
    cached = cache_path(entry, cache_dir)
    return cached if cached.is_file() else None


def trace_path(
    name: str,
    cache_dir: Path | None = None,
    timeout_s: float = 60.0,
    progress: bool = False,
) -> Path:
    """Path of the registered trace ``name``, downloading it into the cache if needed.

    A copy in ``$DUALPACE_AZURE_DIR`` is taken as is (the user chose it); a cached copy is used if
    its checksum matches the pinned one (or none is pinned); otherwise the file is downloaded.
    """
    entry = trace_entry(name)
    found, dest = local_copy(entry, cache_dir), cache_path(entry, cache_dir)
    if found is not None and found != dest:  # from $DUALPACE_AZURE_DIR
        return found
    if found is not None and entry.sha256 in (None, file_sha256(found)):
        return found
    _download(entry, dest, timeout_s, progress)
    return dest


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def _manual_fix(entry: TraceEntry, dest: Path) -> str:
    fix = f"download {entry.url} yourself and save it as {dest}"
    if entry.name in AZURE_2023:
        fix += f", or set {AZURE_DIR_ENV} to a folder holding {entry.file_name}"
    return (f"{fix}; or replay your own copy with workload.source: {entry.format} and "
            "workload.path, or use workload.source: default (offline)")


def _download(entry: TraceEntry, dest: Path, timeout_s: float, progress: bool) -> None:
    """Stream into a temporary file beside ``dest`` and rename, so no reader sees a partial file."""
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.")
    except OSError as exc:
        raise WorkloadError(f"could not write in {dest.parent} ({exc.strerror}); set "
                            "XDG_CACHE_HOME to a writable folder") from exc
    tmp = Path(name)
    digest = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as f, urllib.request.urlopen(entry.url, timeout=timeout_s) as r:
            total = int(r.headers.get("Content-Length") or 0) or None
            with progress_bar(progress, total=total, unit="B", unit_scale=True,
                              desc=entry.name) as bar:
                while chunk := r.read(CHUNK_BYTES):
                    f.write(chunk)
                    digest.update(chunk)
                    bar.update(len(chunk))
    except OSError as exc:  # URLError, HTTPError, timeouts and write errors are OSErrors
        tmp.unlink(missing_ok=True)
        reason = " ".join(str(getattr(exc, "reason", None) or exc).split())
        raise WorkloadError(
            f"could not download {entry.url} ({reason}); {_manual_fix(entry, dest)}"
        ) from exc
    except BaseException:  # Ctrl-C, SIGTERM mid-download: no hidden partial file in the cache
        tmp.unlink(missing_ok=True)
        raise
    if entry.sha256 is not None and digest.hexdigest() != entry.sha256:
        tmp.unlink()
        raise WorkloadError(
            f"{entry.url}: downloaded file has sha256 {digest.hexdigest()}, expected "
            f"{entry.sha256} (the upstream file changed or the download was corrupted); "
            f"{_manual_fix(entry, dest)}"
        )
    os.replace(tmp, dest)
