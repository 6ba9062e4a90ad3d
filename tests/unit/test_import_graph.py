"""The package has no import circle, function-level imports included (STYLE item 11)."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "gpusession"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(source: str, name: str, known: set[str], *, is_package: bool = False) -> set[str]:
    """Every module of `known` that module `name` (whose code is `source`) imports, at any depth
    of its code (functions too). `from . import x` imports module x when x is one, else the package."""
    package = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                child = f"{target}.{alias.name}"
                found.add(child if child in known else target)
    return {m for m in found if m in known and m != name}


def import_graph() -> dict[str, set[str]]:
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    known = set(paths)
    # a package's __init__ that only re-exports lazily still counts: it is a module like any other
    return {name: imported_modules(path.read_text(), name, known, is_package=path.name == "__init__.py")
            for name, path in paths.items()}


def find_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of imports (a -> b -> ... -> a), or None. Packages' __init__ edges to their own
    submodules are left out: importing a.b always runs a/__init__ first, which is not a circle."""
    WHITE, GREY, BLACK = 0, 1, 2
    colour = dict.fromkeys(graph, WHITE)
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        colour[node] = GREY
        stack.append(node)
        for child in sorted(graph[node]):
            if child.startswith(node + "."):
                continue
            if colour[child] == GREY:
                return stack[stack.index(child):] + [child]
            if colour[child] == WHITE:
                circle = visit(child)
                if circle:
                    return circle
        stack.pop()
        colour[node] = BLACK
        return None

    for start in sorted(graph):
        if colour[start] == WHITE:
            circle = visit(start)
            if circle:
                return circle
    return None


def all_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every circle found by cutting one edge of each found circle in turn (for the message)."""
    graph = {k: set(v) for k, v in graph.items()}
    circles = []
    while (circle := find_circle(graph)) is not None and len(circles) < 50:
        circles.append(circle)
        graph[circle[-2]].discard(circle[-1])
    return circles


def test_the_finder_sees_a_circle_made_by_a_function_level_import():
    known = {"p", "p.a", "p.b", "p.sub", "p.sub.c"}
    graph = {
        "p.a": imported_modules("from . import b\n", "p.a", known),
        "p.b": imported_modules("import os\nfrom .sub.c import thing\n", "p.b", known),
        "p.sub.c": imported_modules("def late():\n    from ..a import x\n", "p.sub.c", known),
        "p": set(), "p.sub": set(),
    }
    assert graph["p.sub.c"] == {"p.a"}, "an import inside a function is an edge too"
    assert find_circle(graph) == ["p.a", "p.b", "p.sub.c", "p.a"]
    graph["p.sub.c"] = set()
    assert find_circle(graph) is None


def test_the_package_has_no_import_circle():
    circles = all_circles(import_graph())
    assert not circles, "import circles (break each by giving the shared piece its own module):\n" + "\n".join(
        " -> ".join(c) for c in circles)
