import io
import re
import shutil
import urllib.error
import urllib.request

import pytest

from dualpace_sim.workload import TRACES, WorkloadError, trace_entry, trace_path
from dualpace_sim.workload.fetch import AZURE_DIR_ENV, cache_path, default_cache_dir, local_copy
from dualpace_sim.workload.traces import LOADERS

NAME = "AzureLLMInferenceTrace_code.csv"
MOONCAKE_LINE = '{"timestamp": 0, "input_length": 6955, "output_length": 52, "hash_ids": [46]}\n'
REAL_URLOPEN = urllib.request.urlopen


@pytest.fixture
def upstream(tmp_path, monkeypatch):
    """Stand in for the network: urlopen serves the file put in upstream[url], else fails."""
    monkeypatch.delenv(AZURE_DIR_ENV, raising=False)
    files = {}

    def urlopen(url, timeout):
        if url not in files:
            raise urllib.error.URLError("Name or service not known")
        return REAL_URLOPEN(files[url].as_uri(), timeout=timeout)

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    return files


@pytest.fixture
def azure_code(azure_dir, tmp_path, upstream):
    """The code trace served at its upstream URL; returns the served copy."""
    served = tmp_path / "served" / NAME
    served.parent.mkdir()
    shutil.copy(azure_dir / NAME, served)
    upstream[TRACES["azure-2023-code"].url] = served
    return served


def test_downloads_into_cache_then_reuses_it(azure_code, tmp_path):
    cache = tmp_path / "cache"
    path = trace_path("azure-2023-code", cache_dir=cache)
    assert path == cache / "azure-2023-code" / NAME
    assert path.read_bytes() == azure_code.read_bytes()
    assert [p.name for p in path.parent.iterdir()] == [NAME]  # no temporary file left behind
    azure_code.unlink()
    assert trace_path("azure-2023-code", cache_dir=cache) == path


def test_env_dir_comes_first(azure_code, tmp_path, monkeypatch):
    monkeypatch.setenv(AZURE_DIR_ENV, str(azure_code.parent))
    assert trace_path("azure-2023-code", cache_dir=tmp_path / "cache") == azure_code
    assert not (tmp_path / "cache").exists()


def test_checksum_mismatch_is_rejected_and_not_cached(azure_code, tmp_path):
    with azure_code.open("a") as f:
        f.write("2023-11-16 19:14:20.0000000,1,1\n")
    cache = tmp_path / "cache"
    with pytest.raises(WorkloadError) as info:
        trace_path("azure-2023-code", cache_dir=cache)
    message = str(info.value)
    assert "\n" not in message and "sha256" in message
    assert f"save it as {cache / 'azure-2023-code' / NAME}" in message
    assert list((cache / "azure-2023-code").iterdir()) == []


def test_corrupt_cache_is_downloaded_again(azure_code, tmp_path):
    cache = tmp_path / "cache"
    dest = cache_path(trace_entry("azure-2023-code"), cache)
    dest.parent.mkdir(parents=True)
    dest.write_text("truncated")
    assert trace_path("azure-2023-code", cache_dir=cache).read_bytes() == azure_code.read_bytes()


def test_offline_error_says_what_to_download_and_where_to_put_it(upstream, tmp_path):
    entry = trace_entry("azure-2023-conv")
    with pytest.raises(WorkloadError) as info:
        trace_path("azure-2023-conv", cache_dir=tmp_path)
    message = str(info.value)
    assert "\n" not in message and "Name or service not known" in message
    assert f"download {entry.url} yourself and save it as {cache_path(entry, tmp_path)}" in message
    assert AZURE_DIR_ENV in message and "source: default" in message


def test_unpinned_trace_is_downloaded_unchecked_then_reused(upstream, tmp_path):
    entry = trace_entry("mooncake-conversation")
    assert entry.sha256 is None
    served = tmp_path / "conversation_trace.jsonl"
    served.write_text(MOONCAKE_LINE)
    upstream[entry.url] = served
    path = trace_path(entry.name, cache_dir=tmp_path / "cache")
    assert path.read_text() == MOONCAKE_LINE and local_copy(entry, tmp_path / "cache") == path
    served.unlink()
    assert trace_path(entry.name, cache_dir=tmp_path / "cache") == path


def test_default_cache_dir_follows_xdg(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_cache_dir() == tmp_path / "dualpace" / "traces"


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(WorkloadError, match="unknown trace 'chat'.*azure-2023-conv"):
        trace_path("chat")


@pytest.mark.parametrize("name", list(TRACES))
def test_registry_entries_are_complete(name):
    entry = TRACES[name]
    assert entry.name == name and entry.format in LOADERS
    assert entry.url.startswith("https://") and entry.url.endswith("/" + entry.file_name)
    assert entry.sha256 is None or re.fullmatch("[0-9a-f]{64}", entry.sha256)
    assert entry.description and entry.size and entry.license and entry.attribution


def test_an_interrupted_download_leaves_no_partial_file(tmp_path, monkeypatch):
    """Ctrl-C in the middle of a download: the hidden temporary file goes with it."""
    monkeypatch.delenv(AZURE_DIR_ENV, raising=False)

    class Interrupted(io.BytesIO):
        headers: dict = {}

        def read(self, n=-1):
            if self.tell():
                raise KeyboardInterrupt
            return super().read(4)

    monkeypatch.setattr(urllib.request, "urlopen",
                        lambda url, timeout: Interrupted(b"TIMESTAMP,ContextTokens\n"))
    cache = tmp_path / "cache"
    with pytest.raises(KeyboardInterrupt):
        trace_path("azure-2023-code", cache_dir=cache)
    assert list((cache / "azure-2023-code").iterdir()) == []
