"""The host's read bandwidth, as `dualpace-hw profile` and `run` record it."""

from __future__ import annotations

from dualpace_hw.kernels.host_read import MIN_READ_BYTES, host_read_bytes_per_s, read_buffer_bytes


def test_the_buffer_spans_four_last_level_caches_or_a_floor_where_sysfs_is_silent():
    assert read_buffer_bytes(105 << 20) == 420 << 20
    assert read_buffer_bytes(0) == MIN_READ_BYTES == 256 << 20


def test_the_figure_is_in_bytes_per_second():
    """A 2-core CI box streams a few GB/s, an H200 box's 14 cores 75-93 GB/s: bytes per
    second, not seconds or GB/s."""
    assert 1e8 < host_read_bytes_per_s(32 << 20, passes=3) < 1e13
