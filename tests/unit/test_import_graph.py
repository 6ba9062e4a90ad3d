"""The code points one way: no import circle, and no import from a lower folder to a higher one,
function-level imports included (STYLE item 11), over gpusession/ and jupyter_ext/.

The folders, bottom to top (LAYERS; docs/architecture.md shows the same list). A module may import
its own folder and the folders below it, never one above: a folder can then be read, tested and
changed knowing only what lies under it.
"""
from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "gpusession"
TOPS = ("gpusession", "jupyter_ext")

# (the modules or folders of one layer, why it sits there), bottom first
LAYERS: list[tuple[tuple[str, ...], str]] = [
    (("gpusession._version", "gpusession.errors", "gpusession.identity"),
     "the shared base: the version, the errors every layer raises, who is calling"),
    (("gpusession.observe",),
     "what a run tells the world (Observer, RunInfo) and the renderers that draw it: plain data "
     "and text, imported by every side that reports"),
    (("gpusession.cluster",),
     "Ray plumbing: joining a cluster, the local head, Ray's private APIs, node liveness; knows "
     "nothing of leases or runs"),
    (("gpusession.run",),
     "the run's shared vocabulary (run/*.py): the messages between rank, worker and caller, the "
     "rank's spec, the failure policies, shipping and communication options"),
    (("gpusession.run.rank",), "what runs inside a rank process, and what user code calls there"),
    (("gpusession.run.node",),
     "what runs on a node for its ranks: the node host, the warm parent that forks the ranks, the "
     "worker actor"),
    (("gpusession.launcher",),
     "the hub's node launcher (root): the warm parent's loop, whose children drop to their user"),
    (("gpusession.broker.policy",), "the broker's pure policy: plain values in, decisions out"),
    (("gpusession.broker.protocol",), "what travels between a caller and the broker: request, notice"),
    (("gpusession.broker.storage",), "the broker's ledger, journal, books and state directory"),
    (("gpusession.broker.http",), "the broker's read-only status endpoint"),
    (("gpusession.broker.service",), "the broker actor and its methods, over policy and storage"),
    (("gpusession.broker",), "broker/client.py: the caller's handle on the broker, which starts it"),
    (("gpusession.run.caller",),
     "the caller's side of a run, wherever the lease is held (a kernel, or the gateway for a hub "
     "kernel): the lease, the run controller, the warm worker pool"),
    (("gpusession.gateway",),
     "the per-user gateway: holds leases and runs for a hub user's kernels (over run/caller), "
     "and the kernel's client of it"),
    (("gpusession.api",),
     "what a user's code calls (gs.distributed, gs.lease, Run, gs.attach, gs.status): picks this "
     "process's own lease or the gateway"),
    (("gpusession.sweeps",), "gs.sweep: many calls of gs.distributed, searched by Optuna"),
    (("gpusession.notebook",), "the %%gpu and %gpu magics, over the API"),
    (("jupyter_ext",), "the Jupyter server extension: REST API, the Lab sidebar's data, the embedded cluster"),
    (("gpusession.hub",), "`gpusession hub`: JupyterHub, accounts, the gateways and launchers it starts"),
    (("gpusession.cli",), "the `gpusession` command, over everything it starts or asks"),
    (("gpusession",), "the package root's public API (`import gpusession as gs`), at the very top"),
]


def layer_of(module: str) -> int:
    """The index in LAYERS of a module: its longest matching module or folder."""
    best, length = -1, -1
    for index, (names, _why) in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and len(name) > length:
                best, length = index, len(name)
    if best < 0:
        raise LookupError(f"{module} is in no layer: add its folder to LAYERS")
    return best


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import from a lower layer to a higher one, as "a (layer) -> b (layer)"."""
    found = []
    for module, imported in sorted(graph.items()):
        for other in sorted(imported):
            if other.startswith(module + "."):
                continue  # a package's __init__ and its own submodules
            if layer_of(other) > layer_of(module):
                found.append(f"{module} ({LAYERS[layer_of(module)][0][0]}) -> {other} "
                             f"({LAYERS[layer_of(other)][0][0]})")
    return found


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
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
    paths = {module_name(p): p for top in TOPS for p in (REPO / top).rglob("*.py")}
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


def test_the_packages_have_no_import_circle():
    circles = all_circles(import_graph())
    assert not circles, "import circles (break each by giving the shared piece its own module):\n" + "\n".join(
        " -> ".join(c) for c in circles)



def test_the_package_root_and_jupyter_ext_are_in_the_graph():
    graph = import_graph()
    assert "jupyter_ext.app" in graph and "jupyter_ext.announce" in graph
    assert "jupyter_ext.app" in graph["gpusession"], "the root's server extension point is an edge too"


def test_every_module_is_in_a_layer():
    missing = []
    for module in import_graph():
        try:
            layer_of(module)
        except LookupError as exc:
            missing.append(str(exc))
    assert not missing, "\n".join(missing)


def test_the_checker_sees_a_made_up_upward_import():
    known = {"gpusession", "gpusession.errors", "gpusession.cluster", "gpusession.cluster.raycluster",
             "gpusession.run", "gpusession.run.caller", "gpusession.run.caller.lease"}
    graph = {name: set() for name in known}
    graph["gpusession.cluster.raycluster"] = imported_modules(
        "from ..errors import GPUSessionError\n"
        "def late():\n    from ..run.caller.lease import Lease\n", "gpusession.cluster.raycluster", known)
    assert graph["gpusession.cluster.raycluster"] == {"gpusession.errors", "gpusession.run.caller.lease"}
    assert upward_imports(graph) == [
        "gpusession.cluster.raycluster (gpusession.cluster) -> gpusession.run.caller.lease (gpusession.run.caller)"]
    graph["gpusession.run.caller.lease"] = {"gpusession.cluster.raycluster", "gpusession.errors"}
    graph["gpusession.cluster.raycluster"] = {"gpusession.errors"}
    assert upward_imports(graph) == [], "downward and same-layer imports are allowed"


def test_folders_point_one_way():
    upward = upward_imports(import_graph())
    assert not upward, ("imports from a lower folder to a higher one (tests/unit/test_import_graph.py, "
                        "LAYERS: move the shared piece down, or the importer up):\n" + "\n".join(upward))


def test_the_layers_are_written_down_once_more_in_the_architecture_page():
    page = (REPO / "docs" / "architecture.md").read_text()
    listed = [names[0].removeprefix("gpusession.").replace(".", "/") for names, _ in LAYERS]
    positions = [page.find(f"`{name}`") for name in listed[1:-1]]
    assert -1 not in positions, [name for name, at in zip(listed[1:-1], positions) if at == -1]
    assert positions == sorted(positions), "docs/architecture.md lists the layers in LAYERS' order"
