"""The app layer's modules import each other without a cycle, counting imports made inside
functions: a lazy import that holds a cycle apart hides a module that does two jobs."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "dualpace_sim"


def imported_modules(path: Path) -> set[str]:
    """The top-level `dualpace_sim` modules a module of the package's top level imports."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level == 1:
                base = f"dualpace_sim.{base}" if base else "dualpace_sim"
            names |= {base, *(f"{base}.{a.name}" for a in node.names)}
        elif isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
    return {".".join(n.split(".")[:2]) for n in names if n.startswith("dualpace_sim.")}


def test_the_app_layer_has_no_import_cycle():
    modules = {f"dualpace_sim.{p.stem}": p for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    graph = {m: imported_modules(p) & set(modules) - {m} for m, p in modules.items()}
    state: dict[str, str] = {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = "open"
        for n in sorted(graph[m]):
            assert state.get(n) != "open", "import cycle: " + " -> ".join([*path, n])
            if n not in state:
                visit(n, [*path, n])
        state[m] = "done"

    for m in sorted(modules):
        if m not in state:
            visit(m, [m])
