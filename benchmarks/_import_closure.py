"""Which of the project's own modules a measured path imports, read from the source (no import
runs): a results file names the code it measures ("measures": gpusession/run, ...), and what that
code imports from the rest of the package (gpusession/observe, gpusession/errors.py, ...) is on
the measured path too, so a change there makes the row stale as well (benchmarks/_git_facts.py).

Every `import` and `from ... import` counts, at module level or inside a function (the run path
imports lazily), relative ones resolved against their package. Only the packages named in
PACKAGES are followed; everything else (Ray, torch, the standard library) is not this project's.
"""
from __future__ import annotations

import ast
import functools
from pathlib import Path

PACKAGES = ("gpusession", "jupyter_ext")


@functools.lru_cache(maxsize=None)
def imported_paths(root: Path, measures: tuple[str, ...]) -> tuple[str, ...]:
    """The files (paths from ROOT, sorted) of every module of PACKAGES that the Python files under
    MEASURES import, directly or through each other, the package `__init__.py` files on the way
    included; the measured files themselves are left out (they are named already)."""
    start = [path for measured in measures for path in _python_files(root / measured)]
    seen: set[Path] = set(start)
    todo = list(start)
    while todo:
        path = todo.pop()
        for name in _imported_names(path, _module_of(root, path)):
            for found in _files_of(root, name):
                if found not in seen:
                    seen.add(found)
                    todo.append(found)
    measured = set(start)
    return tuple(sorted(str(path.relative_to(root)) for path in seen - measured))


def _python_files(path: Path) -> list[Path]:
    if path.is_dir():
        return sorted(path.rglob("*.py"))
    return [path] if path.suffix == ".py" and path.exists() else []


def _module_of(root: Path, path: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.lru_cache(maxsize=None)
def _imported_names(path: Path, module: str) -> tuple[str, ...]:
    """Dotted names this file imports (for `from a import b`: both `a` and `a.b`, as b may be a
    module); unreadable or unparsable files import nothing."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return ()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _resolved(package, node.level, node.module)
            if base is None:
                continue
            names.append(base)
            names.extend(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
    return tuple(name for name in names if name.split(".")[0] in PACKAGES)


def _resolved(package: str, level: int, module: str | None) -> str | None:
    if level == 0:
        return module
    parts = package.split(".") if package else []
    if level - 1 > len(parts):
        return None  # beyond the top of the tree: not ours
    kept = parts[:len(parts) - (level - 1)]
    return ".".join(kept + ([module] if module else [])) or None


def _files_of(root: Path, name: str) -> list[Path]:
    """The files importing NAME runs: every package `__init__.py` on its way, and the module."""
    parts = name.split(".")
    files = []
    for depth in range(1, len(parts) + 1):
        base = root.joinpath(*parts[:depth])
        if (base / "__init__.py").is_file():
            files.append(base / "__init__.py")
        elif base.with_suffix(".py").is_file():
            files.append(base.with_suffix(".py"))
            break
        else:
            break
    return files
