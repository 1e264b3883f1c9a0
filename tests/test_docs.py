"""The docs match the code.

Every command and option of both programs has help text and shows it in `--help`; the generated
CLI reference names every command and option with that text; the generated scenario and profile
references have a described row for every key of their schemas; and every file, class and
function the concept map cites exists. The command tree and the schemas are walked here on
their own, not through the generators, so a generator that skipped something would be caught.
"""

from __future__ import annotations

import ast
import dataclasses
import re
import typing
from pathlib import Path

import pytest
import typer
import typer.main
from pydantic import BaseModel, TypeAdapter
from typer.testing import CliRunner

pytest.importorskip("mkdocs", reason="the docs extra: pip install -e '.[docs]'")

ROOT = Path(__file__).resolve().parents[1]
GEN = ROOT / "docs" / "gen"


@pytest.fixture(scope="module")
def hooks():
    """docs/gen/hooks.py, imported the way mkdocs does (its folder on sys.path)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(GEN))
        import hooks as module  # noqa: PLC0415 - only importable with docs/gen on the path

        yield module


@pytest.fixture(scope="module")
def pages(hooks) -> dict[str, str]:
    return hooks.reference_pages()[0]


def _commands(app: typer.Typer, prog: str) -> list[tuple[str, object, object]]:
    """(path, command, context) of every visible command, from typer's click tree."""
    out = []

    def visit(cmd, ctx, path):
        out.append((path, cmd, ctx))
        if hasattr(cmd, "list_commands"):
            for name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, name)
                if not sub.hidden:
                    visit(sub, typer.Context(sub, parent=ctx, info_name=name), f"{path} {name}")

    root = typer.main.get_command(app)
    visit(root, typer.Context(root, info_name=prog), prog)
    return out


def _params(cmd, ctx) -> list:
    helps = set(ctx.help_option_names)
    return [p for p in cmd.get_params(ctx)
            if not getattr(p, "hidden", False) and not set(p.opts) <= helps]


def _apps():
    from dualpace_hw.cli import app as hw_app
    from dualpace_sim.cli.main import app as sim_app

    return [(sim_app, "dualpace-sim"), (hw_app, "dualpace-hw")]


def _squash(text: str) -> str:
    """Words only: rich's boxes, wrapping and Markdown's escapes do not count."""
    text = text.replace("&lt;", "<").replace("&gt;", ">").replace("\\", "")
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", text).split())


@pytest.mark.parametrize("app,prog", _apps(), ids=["dualpace-sim", "dualpace-hw"])
def test_every_command_and_option_has_help_and_shows_it(app, prog):
    runner = CliRunner()
    commands = _commands(app, prog)
    assert len(commands) > 1, f"{prog} has no subcommands?"
    for path, cmd, ctx in commands:
        assert (cmd.help or cmd.short_help or "").strip(), f"`{path}` has no help text"
        result = runner.invoke(app, [*path.split()[1:], "--help"], env={"COLUMNS": "250"})
        assert result.exit_code == 0, f"`{path} --help` failed: {result.output}"
        shown = _squash(result.output)
        for p in _params(cmd, ctx):
            text = (getattr(p, "help", None) or "").strip()
            assert text, f"`{path}` parameter {p.name} has no help text"
            assert _squash(text) in shown, f"`{path} --help` does not show {p.name}'s help"
            for opt in p.opts + p.secondary_opts:
                if opt.startswith("-"):
                    assert opt in shown, f"`{path} --help` does not show {opt}"


@pytest.mark.parametrize("app,prog", _apps(), ids=["dualpace-sim", "dualpace-hw"])
def test_cli_reference_has_every_command_and_option(pages, app, prog):
    page = pages["reference/cli.md"]
    squashed = _squash(page)
    for path, cmd, ctx in _commands(app, prog):
        assert f"`{path}` {{#{path.replace(' ', '-')}}}" in page, f"no section for `{path}`"
        assert _squash(cmd.help or cmd.short_help) in squashed, f"`{path}`'s help is missing"
        for p in _params(cmd, ctx):
            for opt in p.opts + p.secondary_opts:
                if opt.startswith("-"):
                    assert opt in page, f"`{path}` option {opt} missing from the CLI reference"
            assert _squash(p.help) in squashed, f"`{path}` {p.name}'s help is missing"


def _models(annotation) -> list[type]:
    """The models (pydantic or dataclass) a field's annotation can hold."""
    if isinstance(annotation, type) and (
        issubclass(annotation, BaseModel) or dataclasses.is_dataclass(annotation)
    ):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models(arg)]


def _schema_fields(model: type) -> list[tuple[str, str, str | None]]:
    """(Model.key, key, description) of every field of `model` and of every model below it."""
    out, seen, todo = [], set(), [model]
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        if issubclass(m, BaseModel):
            for name, info in m.model_fields.items():
                out.append((f"{m.__name__}.{name}", name, info.description))
                todo += _models(info.annotation)
        else:  # a stdlib dataclass (ModelShape): its fields are scalars
            schema = TypeAdapter(m).json_schema()["properties"]
            out += [(f"{m.__name__}.{f.name}", f.name, schema[f.name].get("description"))
                    for f in dataclasses.fields(m)]
    return out


@pytest.mark.parametrize("page,model", [
    ("reference/scenario.md", "dualpace_sim.config.scenario:Scenario"),
    ("reference/profile.md", "dualpace_sim.costs.profile:Profile"),
])
def test_schema_references_describe_every_key(pages, page, model):
    module, name = model.split(":")
    cls = getattr(__import__(module, fromlist=[name]), name)
    text = pages[page]
    fields = _schema_fields(cls)
    assert len(fields) > 20
    for where, key, description in fields:
        assert description, f"{where} has no description (Field(description=...))"
        rows = [line for line in text.splitlines() if line.startswith(f"| `{key}` |")]
        assert rows, f"{page}: no row for {key}"
        assert any(_squash(description) in _squash(row) for row in rows), (
            f"{page}: {key}'s description is missing")


def test_the_build_reports_nothing_undocumented(hooks):
    assert hooks.reference_pages()[1] == []


def _defined(path: Path) -> set[str]:
    """Names a module defines: top-level classes, functions and assignments; `Class.member`
    for methods, class-body fields and `self.x` attributes set in its methods."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.ClassDef):
            names.add(node.name)
            for item in ast.walk(node):
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    names.add(f"{node.name}.{item.name}")
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    names.add(f"{node.name}.{item.target.id}")
                elif isinstance(item, ast.Attribute) and isinstance(item.value, ast.Name) \
                        and item.value.id == "self" and isinstance(item.ctx, ast.Store):
                    names.add(f"{node.name}.{item.attr}")
    return names


def test_concept_map_cites_only_code_that_exists():
    rows = [line for line in (ROOT / "docs" / "concepts.md").read_text().splitlines()
            if line.startswith("| ") and line.count("|") == 4]
    cited = 0
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        module = re.fullmatch(r"`([\w/.]+\.py)`", cells[1])
        if module is None:
            continue
        path = ROOT / module.group(1)
        assert path.is_file(), f"docs/concepts.md cites {module.group(1)}, which does not exist"
        defined = _defined(path)
        for name in re.findall(r"`([\w.]+)`", cells[2]):
            assert name in defined, f"docs/concepts.md cites {name} in {module.group(1)}"
            cited += 1
    assert cited > 50, "the concept map's tables were not found"
    for path in re.findall(r"`((?:dualpace_sim|dualpace_hw|tests|benchmarks|scenarios)/[\w/.-]+)`",
                           (ROOT / "docs" / "concepts.md").read_text()):
        assert (ROOT / path).exists(), f"docs/concepts.md cites {path}, which does not exist"

