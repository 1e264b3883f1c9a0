"""A Markdown reference of a file format, made from its pydantic models at docs build time.

The scenario and profile references are generated, not written, so that they cannot drift from
the schema that validates the files: every key, its type and constraints, its default and its
description come from the model's JSON schema. A key without a description is reported, and the
docs build (`mkdocs build --strict`) fails on it.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass
from typing import Any

from mdtext import cell, prose
from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema


class _FactoryDefaults(GenerateJsonSchema):
    """Also report defaults made by a ``default_factory`` (whole sections such as
    ``scheduler:``), which pydantic leaves out of a JSON schema."""

    def get_default_value(self, schema: Any) -> Any:
        factory = schema.get("default_factory")
        if factory is not None and not schema.get("default_factory_takes_data"):
            return factory()
        return super().get_default_value(schema)


@dataclass
class SchemaReference:
    markdown: str
    undocumented: list[str]  # keys (dotted, or Section.key) that have no description


@dataclass
class _Section:
    name: str  # the $defs name (the model's class name)
    paths: list[str]  # every dotted key path whose value is this model

    @property
    def shared(self) -> bool:
        """A model used under several keys (a table type) is titled by its class name."""
        return len(self.paths) != 1

    @property
    def anchor(self) -> str:
        return self.name.lower() if self.shared else self.paths[0].replace(".", "-")

    @property
    def title(self) -> str:
        return self.name if self.shared else self.paths[0]


def _ref_name(schema: dict) -> str | None:
    ref = schema.get("$ref")
    return ref.rsplit("/", 1)[-1] if ref else None


def _refs(schema: dict) -> list[str]:
    """The models a property's value can be (through anyOf, lists and mappings)."""
    out = []
    name = _ref_name(schema)
    if name:
        out.append(name)
    for part in schema.get("anyOf", []) + schema.get("allOf", []):
        out += _refs(part)
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            out += _refs(schema[key])
    return out


def _sections(root: dict, defs: dict) -> list[_Section]:
    """Every model reachable from the root, in breadth-first order of first use."""
    found: dict[str, _Section] = {}
    queue: deque[tuple[dict, str]] = deque([(root, "")])
    while queue:
        schema, prefix = queue.popleft()
        for key, prop in schema.get("properties", {}).items():
            path = f"{prefix}{key}"
            for name in _refs(prop):
                if name not in found:
                    found[name] = _Section(name, [])
                    queue.append((defs[name], f"{path}."))
                found[name].paths.append(path)
    return list(found.values())


def _bounds(schema: dict) -> list[str]:
    marks = [("minimum", "≥"), ("exclusiveMinimum", ">"), ("maximum", "≤"),
             ("exclusiveMaximum", "<")]
    return [f"{sign} {json.dumps(schema[k])}" for k, sign in marks if k in schema]


def _type(schema: dict, sections: dict[str, _Section]) -> str:
    name = _ref_name(schema)
    if name:
        s = sections[name]
        return f"[`{s.name}`](#{s.anchor})" if s.shared else f"[section](#{s.anchor})"
    if "anyOf" in schema or "allOf" in schema:
        parts = [_type(p, sections) for p in schema.get("anyOf", []) + schema.get("allOf", [])]
        return " or ".join(parts)
    if "enum" in schema:
        return "one of " + ", ".join(f"`{v}`" for v in schema["enum"])
    if "const" in schema:
        return f"`{schema['const']}`"
    kind = schema.get("type")
    if kind == "array":
        text = "list of " + _inner(schema.get("items", {}), sections)
        if "minItems" in schema:
            text += f" (at least {schema['minItems']})"
        return text
    if kind == "object":
        values = schema.get("additionalProperties")
        return "mapping" + (f" of names to {_inner(values, sections)}"
                            if isinstance(values, dict) else "")
    if kind is None:
        return "any"
    if kind == "null":
        return "`null`"
    return " ".join([kind, ", ".join(_bounds(schema))]).strip()


def _inner(schema: dict, sections: dict[str, _Section]) -> str:
    """The type of a list's items or a mapping's values, in parentheses when it has choices."""
    text = _type(schema, sections)
    return f"({text})" if " or " in text else text


def _default(key: str, prop: dict, required: set[str]) -> str:
    if key in required:
        return "required"
    if "default" not in prop:
        return "optional"
    value = prop["default"]
    if isinstance(value, dict) and _refs(prop):
        return "the section's defaults"
    return f"`{json.dumps(value)}`"


def _table(schema: dict, sections: dict[str, _Section], where: str,
           undocumented: list[str]) -> list[str]:
    required = set(schema.get("required", []))
    lines = ["| key | type | default | description |", "|---|---|---|---|"]
    for key, prop in schema.get("properties", {}).items():
        description = prop.get("description", "")
        if not description:
            undocumented.append(f"{where}{key}")
        lines.append(f"| `{key}` | {_type(prop, sections)} | {_default(key, prop, required)} "
                     f"| {cell(description)} |")
    return lines


def schema_reference(model: type[BaseModel], title: str, intro: str) -> SchemaReference:
    """The reference page of `model`: the top-level keys, then one section per nested model."""
    root = model.model_json_schema(schema_generator=_FactoryDefaults)
    defs = root.pop("$defs", {})
    sections = _sections(root, defs)
    by_name = {s.name: s for s in sections}
    undocumented: list[str] = []
    out = [f"# {title}", "", intro, ""]
    if root.get("description"):
        out += [root["description"], ""]
    out += ["## Top level {#top-level}", ""]
    out += _table(root, by_name, "", undocumented)
    for s in sections:
        schema = defs[s.name]
        out += ["", f"## `{s.title}` {{#{s.anchor}}}", ""]
        if s.shared:
            out += ["Used by " + ", ".join(f"`{p}`" for p in s.paths) + ".", ""]
        if schema.get("description"):
            out += [prose(schema["description"]), ""]
        where = f"{s.name}." if s.shared else f"{s.paths[0]}."
        out += _table(schema, by_name, where, undocumented)
    return SchemaReference("\n".join(out) + "\n", undocumented)
