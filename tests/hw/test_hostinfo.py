"""Where tensor-parallel CPU ranks run: NUMA nodes read from sysfs, ranks never straddling one."""

from __future__ import annotations

import re

import pytest

from dualpace_hw import hostinfo
from dualpace_hw.hostinfo import last_level_cache_bytes, numa_nodes, rank_cores


def fake_sysfs(tmp_path, lists: list[str]):
    for i, text in enumerate(lists):
        (tmp_path / f"node{i}").mkdir()
        (tmp_path / f"node{i}" / "cpulist").write_text(text + "\n")
    return tmp_path


def test_numa_nodes_parse_cpulists_in_node_order(tmp_path):
    root = fake_sysfs(tmp_path, ["0-3,8-11", "4-7,12-15"])
    assert numa_nodes(root) == [{0, 1, 2, 3, 8, 9, 10, 11}, {4, 5, 6, 7, 12, 13, 14, 15}]
    assert numa_nodes(tmp_path / "missing")  # no sysfs: one node of every core


def test_ranks_stay_inside_their_numa_node():
    """Two sockets whose cores interleave (0-3,8-11 | 4-7,12-15): consecutive ranges would put
    each rank across both sockets; the split keeps each on one."""
    nodes = [{0, 1, 2, 3, 8, 9, 10, 11}, {4, 5, 6, 7, 12, 13, 14, 15}]
    cores = list(range(16))
    two = rank_cores(cores, 2, nodes)
    assert [set(r) for r in two] == nodes
    four = rank_cores(cores, 4, nodes)
    assert [r for r in four] == [(0, 1, 2, 3), (8, 9, 10, 11), (4, 5, 6, 7), (12, 13, 14, 15)]
    assert all(any(set(r) <= n for n in nodes) for r in four)


def test_one_node_or_an_odd_split_gives_consecutive_equal_ranges():
    assert rank_cores(list(range(8)), 2, [set(range(8))]) == [(0, 1, 2, 3), (4, 5, 6, 7)]
    nodes = [{0, 1, 2, 3}, {4, 5, 6, 7}]
    assert rank_cores(list(range(8)), 3, nodes) == [(0, 1), (2, 3), (4, 5)]
    assert rank_cores([0, 1, 4, 5], 2, nodes) == [(0, 1), (4, 5)]  # only the cores given
    with pytest.raises(ValueError, match="3 ranks need at least 3 cores"):
        rank_cores([0, 1], 3, nodes)


def test_last_level_cache_is_the_highest_level_sysfs_lists(tmp_path):
    for i, (level, size) in enumerate([(1, "48K"), (1, "32K"), (2, "2048K"), (3, "105M")]):
        d = tmp_path / f"index{i}"
        d.mkdir()
        (d / "level").write_text(f"{level}\n")
        (d / "size").write_text(f"{size}\n")
    assert last_level_cache_bytes(tmp_path) == 105 * 2**20
    assert last_level_cache_bytes(tmp_path / "missing") == 0


def test_onednn_version_is_the_version_not_the_build_settings():
    config = ("PyTorch built with:\n  - Intel(R) MKL-DNN v3.12.0 (Git Hash 80afa71)\n"
              "  - Build settings: BLAS_INFO=mkl, USE_MKLDNN=ON, TORCH_VERSION=2.13.0\n")
    assert hostinfo.onednn_version(config) == "3.12.0"
    assert hostinfo.onednn_version("  - oneDNN v3.7.1 (Git Hash 1)\n") == "3.7.1"
    assert hostinfo.onednn_version("  - Build settings: USE_MKLDNN=ON\n") is None
    mine = hostinfo.onednn_version()
    assert mine is None or re.fullmatch(r"\d+(\.\d+)+", mine)
