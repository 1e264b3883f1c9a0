"""Atomic writes of results: an interruption while writing leaves the previous file whole."""

from __future__ import annotations

import math

import pytest

from dualpace_sim.results.outputs import json_safe, replace_atomically, write_json


def test_an_interrupted_write_keeps_the_previous_file_and_no_temporary(tmp_path):
    path = tmp_path / "summary.json"
    write_json(path, [{"policy": "dualpace"}])
    before = path.read_bytes()

    def half_then_interrupt(tmp):
        tmp.write_text('[{"policy": "dualpace"}, {"pol')
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        replace_atomically(path, half_then_interrupt)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def test_json_has_no_nan():
    assert json_safe({"a": [math.nan, 1.0, math.inf]}) == {"a": [None, 1.0, None]}
