"""Reading the files users hand the tools: bounded, regular, UTF-8, and YAML without traps.

Scenarios, profiles, hardware specs and model configs are edited by hand or arrive from
elsewhere, so reading one must never hang, exhaust memory or end in a traceback. A path that
is a device (``/dev/zero``) or a directory, a file larger than any real input, text that is not
UTF-8 (a UTF-16 or Latin-1 export), a YAML mapping with a key written twice (YAML's "last one
wins" silently drops the first), nesting too deep for the parser, and an alias bomb (a few
lines that expand to billions of nodes) each become one :class:`InputFileError` line naming
the file and the fix.
"""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import yaml

# Far larger than any real scenario, profile or spec (the largest measured profile is ~1 MB).
MAX_TEXT_BYTES = 64 * 2**20
# Nodes a YAML document may expand to once its aliases are followed: a measured profile has
# ~10^5, an alias bomb of nine lines has 10^9.
MAX_YAML_NODES = 2_000_000

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: fast, and bounds nesting


class InputFileError(ValueError):
    """A file that cannot be read as the input it should be; one line naming file and fix."""


def check_regular_file(path: Path, what: str = "file", limit: int | None = MAX_TEXT_BYTES) -> None:
    """Refuse a missing path, a directory, a device or FIFO, and a file over `limit` bytes (no
    limit: None), before anything reads it (``/dev/zero`` would otherwise be read forever)."""
    try:
        st = path.stat()
    except FileNotFoundError:
        raise InputFileError(f"{path}: no such {what}") from None
    except OSError as e:
        raise InputFileError(f"{path}: cannot read the {what}: {e.strerror}") from None
    if stat.S_ISDIR(st.st_mode):
        raise InputFileError(f"{path}: is a directory; give the {what} itself")
    if not stat.S_ISREG(st.st_mode):
        raise InputFileError(f"{path}: not a regular file (a device, FIFO or socket); give the "
                             f"{what} itself")
    if limit is not None and st.st_size > limit:
        raise InputFileError(f"{path}: {st.st_size:,} bytes, more than the {limit:,} a {what} "
                             "may have; is it the right file?")


def read_text(path: Path | str, what: str = "file", limit: int = MAX_TEXT_BYTES) -> str:
    """The UTF-8 text of the regular file at `path`, checked as :func:`check_regular_file`."""
    path = Path(path)
    check_regular_file(path, what, limit)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise InputFileError(f"{path}: cannot read the {what}: {e.strerror}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        hint = " (it looks like UTF-16)" if data[:2] in (b"\xff\xfe", b"\xfe\xff") else ""
        raise InputFileError(f"{path}: byte {e.start} is not UTF-8{hint}; save the {what} as "
                             "UTF-8") from None


class _StrictLoader(_LOADER):  # type: ignore[misc, valid-type]
    """The safe loader, refusing a mapping that gives one key twice."""

    def construct_mapping(self, node, deep=False):  # noqa: ANN001 (PyYAML's signature)
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: the base class reports it
                break
            if first is not None:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} appears twice (lines {first} and {line}); "
                    "keep one", key_node.start_mark)
            seen[key] = line
        return super().construct_mapping(node, deep)


def _expanded_size(node: yaml.Node, limit: int) -> int:
    """How many nodes `node` stands for once aliases are followed (shared nodes counted each
    time they are referenced), stopping as soon as it passes `limit`."""
    sizes: dict[int, int] = {}

    def size(n: yaml.Node) -> int:
        known = sizes.get(id(n))
        if known is not None:
            return known
        total = 1
        if isinstance(n, yaml.SequenceNode):
            for child in n.value:
                total += size(child)
                if total > limit:
                    break
        elif isinstance(n, yaml.MappingNode):
            for k, v in n.value:
                total += size(k) + size(v)
                if total > limit:
                    break
        sizes[id(n)] = total
        return total

    return size(node)


def yaml_error_text(e: yaml.YAMLError) -> str:
    """PyYAML's error as one line that keeps where it is: "not valid YAML at line 3, column 9:
    expected ',' or '}', but got '<stream end>'"."""
    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    if mark is None:
        return f"not valid YAML: {problem}"
    return f"not valid YAML at line {mark.line + 1}, column {mark.column + 1}: {problem}"


def load_yaml(text: str, source: str) -> Any:
    """Parse YAML text with the checks above; errors are one :class:`InputFileError` line."""
    loader = _StrictLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if _expanded_size(node, MAX_YAML_NODES) > MAX_YAML_NODES:
            raise InputFileError(f"{source}: its aliases expand to more than {MAX_YAML_NODES:,} "
                                 "values (a YAML alias bomb?); write the values out")
        return loader.construct_document(node)
    except yaml.YAMLError as e:
        raise InputFileError(f"{source}: {yaml_error_text(e)}") from None
    except RecursionError:
        raise InputFileError(f"{source}: nested too deeply to be a scenario, profile or spec; "
                             "is it the right file?") from None
    finally:
        loader.dispose()
