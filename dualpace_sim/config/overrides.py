"""Dotted scenario keys: ``--set scheduler.host_kv_blocks=4096`` and a sweep's grid of fields.

A dotted key names a field of the scenario file by its path (``workload.rate``,
``scheduler.host_kv_blocks``); its value is read as YAML, so ``4096`` is a number, ``[1, 2]`` a
list and ``null`` the default. The changes these give are nested like the file and go through
:func:`scenario.read_scenario`, which validates them exactly as if they were written there, so
a bad key or value gets the same one-line error, naming the change.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import yaml

# A point of a grid: each dotted key with its value, in the grid's order.
Setting = tuple[tuple[str, Any], ...]


class OverrideError(ValueError):
    """A ``--set`` that is not ``KEY=VALUE``; the message is one line."""


def nested(dotted: Iterable[tuple[str, Any]]) -> dict:
    """``[("scheduler.host_kv_blocks", 8)]`` -> ``{"scheduler": {"host_kv_blocks": 8}}``."""
    out: dict = {}
    for key, value in dotted:
        parts = key.split(".")
        node = out
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise OverrideError(f"{key}: {part} is set to a value and also has keys below it")
            node = child
        node[parts[-1]] = value
    return out


def parse_set(items: Sequence[str]) -> dict:
    """The changes of repeated ``--set KEY=VALUE`` options, nested like the scenario file."""
    pairs = []
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key or any(not part for part in key.split(".")):
            raise OverrideError(f"--set {item!r}: expected KEY=VALUE with a dotted scenario key, "
                                f"e.g. --set scheduler.host_kv_blocks=4096")
        try:
            value = yaml.safe_load(text) if text.strip() else None
        except yaml.YAMLError:
            value = text  # not YAML (say, "a: b: c"): the text as a string
        pairs.append((key, value))
    return nested(pairs)


def merged(base: Mapping, changes: Mapping) -> dict:
    """``changes`` laid over ``base``: mappings merge key by key, anything else replaces."""
    out = dict(base)
    for key, value in changes.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


def grid_settings(grid: Mapping[str, Sequence[Any]]) -> list[Setting]:
    """Every combination of a grid's values (the last key varying fastest); ``[()]`` for no
    grid, so that a plain sweep has one setting."""
    keys = list(grid)
    return [tuple(zip(keys, values, strict=True))
            for values in itertools.product(*(grid[k] for k in keys))]


def setting_text(setting: Setting) -> str:
    """``scheduler.host_kv_blocks=1024,workload.seed=2``, for folder names and messages."""
    return ",".join(f"{key}={value!r}" if isinstance(value, float) else f"{key}={value}"
                    for key, value in setting)
