"""The shape of the code, measured the same way before and after a layout change (issue 20):
per package folder, its modules and the median and longest function; the functions longer than
the limit in the parts that must stay short (the core, the simulator's engines, the executors);
and blocks of six or more lines repeated anywhere in the two packages.

    python -m benchmarks.layout.code_shape              # from the repository root
    python -m benchmarks.layout.code_shape --json shape.json

Its last line is the figure a layout change is judged by: the longest function in the short
parts over the limit (<= 1 is the target).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("dualpace_sim", "dualpace_hw")
# Where no function may pass LIMIT lines: the scheduling core, the simulator's engines and the
# runtime's executors.
SHORT = ("dualpace_sim/core", "dualpace_sim/sim", "dualpace_hw/executors")
LIMIT = 60
WINDOW = 6  # lines in a duplicated block


@dataclass(frozen=True)
class Function:
    path: str  # relative to the repository root
    name: str  # Class.method or function
    line: int
    length: int  # lines, decorators and docstring included


def functions(path: Path) -> list[Function]:
    """Every function and method of one module, nested ones included."""
    tree = ast.parse(path.read_text(), filename=str(path))
    rel = str(path.relative_to(ROOT))
    found: list[Function] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                start = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                found.append(Function(rel, prefix + child.name, start,
                                      child.end_lineno - start + 1))
                visit(child, f"{prefix}{child.name}.")

    visit(tree, "")
    return found


def modules() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")
                  if "__pycache__" not in p.parts)


def folder_of(path: Path) -> str:
    return str(path.parent.relative_to(ROOT))


def code_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, stripped text) of the lines that carry code: no blanks, no comments."""
    out = []
    for i, line in enumerate(path.read_text().splitlines(), start=1):
        text = line.strip()
        if text and not text.startswith("#"):
            out.append((i, text))
    return out


def duplicated_blocks(paths: list[Path]) -> list[list[tuple[str, int]]]:
    """Runs of WINDOW code lines found in more than one place, each as its (path, first line)
    places; overlapping windows of one repeated run count once, at its first window."""
    places: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for path in paths:
        lines = code_lines(path)
        rel = str(path.relative_to(ROOT))
        for k in range(len(lines) - WINDOW + 1):
            window = "\n".join(text for _, text in lines[k:k + WINDOW])
            if len(window) < 120:  # short lines only (imports, brackets): not a block of code
                continue
            places[hashlib.sha1(window.encode()).hexdigest()].append((rel, lines[k][0]))
    repeated = sorted((p for p in places.values() if len(p) > 1), key=lambda p: p[0])
    blocks, seen = [], set()
    for p in repeated:
        key = tuple((path, line) for path, line in p)
        if any((path, line - d) in seen for path, line in p for d in range(1, WINDOW)):
            seen.update(key)  # the continuation of a run already counted
            continue
        seen.update(key)
        blocks.append(p)
    return blocks


def measure() -> dict:
    paths = modules()
    funcs = [f for p in paths for f in functions(p)]
    by_folder: dict[str, list[Function]] = defaultdict(list)
    mods: dict[str, int] = defaultdict(int)
    for p in paths:
        mods[folder_of(p)] += 1
    for f in funcs:
        by_folder[str(Path(f.path).parent)].append(f)
    folders = {}
    for folder in sorted(mods):
        lengths = [f.length for f in by_folder.get(folder, [])]
        longest = max(by_folder.get(folder, []), key=lambda f: f.length, default=None)
        folders[folder] = {
            "modules": mods[folder], "functions": len(lengths),
            "median_function_lines": statistics.median(lengths) if lengths else 0,
            "max_function_lines": longest.length if longest else 0,
            "longest": f"{longest.path}:{longest.line} {longest.name}" if longest else None}
    short = sorted((f for f in funcs if f.path.startswith(SHORT) and f.length > LIMIT),
                   key=lambda f: -f.length)
    blocks = duplicated_blocks(paths)
    longest_short = max((f.length for f in funcs if f.path.startswith(SHORT)), default=0)
    return {"folders": folders,
            "over_limit": [f"{f.path}:{f.line} {f.name} ({f.length} lines)" for f in short],
            "duplicated_blocks": [[f"{p}:{n}" for p, n in b] for b in blocks],
            "longest_short_function": longest_short, "limit": LIMIT}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args()
    shape = measure()
    print(f"{'folder':<28}{'modules':>8}{'functions':>10}{'median':>8}{'max':>6}  longest")
    for folder, f in shape["folders"].items():
        print(f"{folder:<28}{f['modules']:>8}{f['functions']:>10}"
              f"{f['median_function_lines']:>8.1f}{f['max_function_lines']:>6}  {f['longest']}")
    print(f"\nfunctions over {LIMIT} lines in {', '.join(SHORT)}: {len(shape['over_limit'])}")
    for line in shape["over_limit"]:
        print(f"  {line}")
    print(f"\nblocks of {WINDOW}+ code lines repeated: {len(shape['duplicated_blocks'])}")
    for b in shape["duplicated_blocks"]:
        print("  " + " = ".join(b))
    if args.json:
        args.json.write_text(json.dumps(shape, indent=1))
    ratio = shape["longest_short_function"] / LIMIT
    print(f"\nlongest_short_function={shape['longest_short_function']} limit={LIMIT} "
          f"ratio={ratio:.2f}")


if __name__ == "__main__":
    main()
