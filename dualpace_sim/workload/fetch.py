"""Find or download the Azure LLM Inference Trace 2023 files.

The project may not redistribute the traces (CC-BY 4.0, Azure/AzurePublicDataset; cite Patel et
al., Splitwise, ISCA 2024), so users get them from upstream once and keep them in a cache. Files are
checked against pinned sha256 values: replaying a silently changed trace would make results
incomparable with earlier runs.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import urllib.request
from pathlib import Path

from dualpace_sim.workload.spec import WorkloadError

AZURE_BASE_URL = "https://raw.githubusercontent.com/Azure/AzurePublicDataset/master/data"
AZURE_DIR_ENV = "DUALPACE_AZURE_DIR"
AZURE_SHA256 = {
    "code": "54e9a6d2a4bd06ba1e060304b900abbc74cbea53de96506e60fe5bb4f2277fb6",
    "conv": "2f1e5b666d4e3055fdbba98598ce2ec307767b9064e03e2fa46676dbcc7d0bf8",
}


def azure_file_name(kind: str) -> str:
    if kind not in AZURE_SHA256:
        raise WorkloadError(f"unknown Azure trace {kind!r}; use one of {', '.join(AZURE_SHA256)}")
    return f"AzureLLMInferenceTrace_{kind}.csv"


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/dualpace/azure``, i.e. ``~/.cache/dualpace/azure`` on most systems."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "dualpace" / "azure"


def azure_trace_path(
    kind: str,
    cache_dir: Path | None = None,
    base_url: str = AZURE_BASE_URL,
    timeout_s: float = 60.0,
) -> Path:
    """Path of the ``kind`` ("conv" or "code") trace file, downloading it into the cache if needed.

    Looks in ``$DUALPACE_AZURE_DIR`` first (taken as is: the user chose that copy), then in the
    cache (used only if its checksum matches), then downloads ``{base_url}/{file name}``.
    """
    name = azure_file_name(kind)
    env_dir = os.environ.get(AZURE_DIR_ENV)
    if env_dir and (Path(env_dir) / name).is_file():
        return Path(env_dir) / name
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    cached = cache / name
    if cached.is_file() and _sha256(cached.read_bytes()) == AZURE_SHA256[kind]:
        return cached
    _download(f"{base_url.rstrip('/')}/{name}", cached, AZURE_SHA256[kind], timeout_s)
    return cached


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _download(url: str, dest: Path, sha256: str, timeout_s: float) -> None:
    """Write to a temporary file beside ``dest`` and rename, so no reader sees a partial file."""
    hint = f"set {AZURE_DIR_ENV} to a folder holding {dest.name} or use workload.source: default"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            data = response.read()
    except OSError as exc:  # URLError, HTTPError and timeouts are OSErrors
        reason = " ".join(str(getattr(exc, "reason", exc)).split())
        raise WorkloadError(f"could not download {url} ({reason}); {hint}") from exc
    digest = _sha256(data)
    if digest != sha256:
        raise WorkloadError(
            f"{url}: downloaded file has sha256 {digest}, expected {sha256} (the upstream file "
            f"changed or the download was corrupted); {hint}"
        )
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, dest)
        except OSError:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise WorkloadError(
            f"could not write {dest} ({exc.strerror}); pass another cache folder or {hint}"
        ) from exc
