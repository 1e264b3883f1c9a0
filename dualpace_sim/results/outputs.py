"""Writing results so that an interruption never destroys what was finished before.

Every result file (records, summaries, traces, sweep tables) is written to a hidden temporary
name beside its destination and renamed over it: a rename is atomic, so a kill, a full disk or
Ctrl-C while writing leaves the previous version of the file whole (a multi-policy run keeps
the policies that finished) and never a half-written one.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any


def temporary_name(path: Path) -> Path:
    """The hidden name a result is written to before it replaces ``path``."""
    return path.with_name(f".{path.name}.tmp")


def replace_atomically(path: Path | str, write: Callable[[Path], None]) -> None:
    """Call ``write(tmp)`` and rename ``tmp`` over ``path``; on any failure (an interrupt
    included) ``tmp`` is removed and ``path`` is left as it was."""
    path = Path(path)
    tmp = temporary_name(path)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text_atomically(path: Path | str, text: str) -> None:
    replace_atomically(path, lambda tmp: tmp.write_text(text))


def json_safe(obj: Any) -> Any:
    """``obj`` with non-finite floats as None (JSON has no NaN or infinity)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [json_safe(v) for v in obj]
    return obj


def write_json(path: Path | str, obj: Any) -> None:
    """``obj`` as indented JSON (non-finite floats as null), atomically."""
    write_text_atomically(path, json.dumps(json_safe(obj), indent=2) + "\n")
