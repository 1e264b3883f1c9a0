import shutil

import pytest

from dualpace_sim.workload import WorkloadError, azure_trace_path
from dualpace_sim.workload.fetch import AZURE_DIR_ENV

NAME = "AzureLLMInferenceTrace_code.csv"


@pytest.fixture
def upstream(azure_dir, tmp_path, monkeypatch):
    """A file:// stand-in for the GitHub raw URL holding a copy of the code trace."""
    monkeypatch.delenv(AZURE_DIR_ENV, raising=False)
    folder = tmp_path / "upstream"
    folder.mkdir()
    shutil.copy(azure_dir / NAME, folder / NAME)
    return folder


def test_downloads_into_cache_then_reuses_it(upstream, tmp_path):
    cache = tmp_path / "cache"
    path = azure_trace_path("code", cache_dir=cache, base_url=upstream.as_uri())
    assert path == cache / NAME
    assert path.read_bytes() == (upstream / NAME).read_bytes()
    assert [p.name for p in cache.iterdir()] == [NAME]  # no temporary file left behind
    (upstream / NAME).unlink()
    assert azure_trace_path("code", cache_dir=cache, base_url=upstream.as_uri()) == path


def test_env_dir_comes_first(upstream, tmp_path, monkeypatch):
    monkeypatch.setenv(AZURE_DIR_ENV, str(upstream))
    assert azure_trace_path("code", cache_dir=tmp_path / "cache") == upstream / NAME
    assert not (tmp_path / "cache").exists()


def test_checksum_mismatch_is_rejected_and_not_cached(upstream, tmp_path):
    with (upstream / NAME).open("a") as f:
        f.write("2023-11-16 19:14:20.0000000,1,1\n")
    cache = tmp_path / "cache"
    with pytest.raises(WorkloadError, match="sha256"):
        azure_trace_path("code", cache_dir=cache, base_url=upstream.as_uri())
    assert not (cache / NAME).exists()


def test_corrupt_cache_is_downloaded_again(upstream, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / NAME).write_text("truncated")
    path = azure_trace_path("code", cache_dir=cache, base_url=upstream.as_uri())
    assert path.read_bytes() == (upstream / NAME).read_bytes()


def test_offline_error_names_the_fixes(tmp_path, monkeypatch):
    monkeypatch.delenv(AZURE_DIR_ENV, raising=False)
    with pytest.raises(WorkloadError) as info:
        azure_trace_path("conv", cache_dir=tmp_path, base_url=(tmp_path / "offline").as_uri())
    message = str(info.value)
    assert "\n" not in message
    assert AZURE_DIR_ENV in message and "source: default" in message


def test_unknown_kind():
    with pytest.raises(WorkloadError, match="unknown Azure trace"):
        azure_trace_path("chat")
