"""The history's facts about each results row (benchmarks/_freshness.py decides on them): which
commits changed a row's benchmark script or the code it measures after the row was measured (the
paths its results file names, and the project's modules those import: benchmarks/_import_closure.py),
and which inputs of a derived file were measured after it."""
from __future__ import annotations

import functools
import subprocess
from pathlib import Path

from _freshness import DEFAULT_DERIVED_FROM, RowFacts, judge, measures_of, newer_inputs
from _import_closure import imported_paths
from _results import latest_when
from _same_code import same_code

ROOT = Path(__file__).resolve().parent.parent


def row_machine(document: dict, row: dict) -> dict:
    return row.get("machine") or document.get("machine") or {}


def measured_paths(document: dict, root: Path = ROOT) -> tuple[str, ...]:
    """The benchmark script, the code its results file says it measures, and every module of the
    project that code imports (gpusession/run imports gpusession/observe, gpusession/errors.py, ...:
    a change there changes what was measured as well)."""
    script = document.get("script") or document["benchmark"]
    named = tuple(document.get("measures", measures_of(script)))
    return (f"benchmarks/{script}.py", *named, *imported_paths(root, named))


def git_available(root: Path = ROOT) -> bool:
    try:
        return subprocess.run(["git", "rev-parse", "--git-dir"], cwd=root, capture_output=True,
                              timeout=10).returncode == 0
    except OSError:
        return False


@functools.lru_cache(maxsize=None)
def changes_since(commit: str, paths: tuple[str, ...], root: Path = ROOT) -> tuple[str, ...] | None:
    """Commits after COMMIT (its "+dirty" dropped) up to HEAD that change the code in PATHS (not
    only its docstrings and comments), oldest first; None when COMMIT is not in the history."""
    base = commit.split("+", 1)[0]
    known = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{base}^{{commit}}"], cwd=root,
                           capture_output=True, text=True, timeout=30)
    if known.returncode != 0:
        return None
    out = subprocess.run(["git", "log", "--reverse", "--abbrev=7", "--format=%h", f"{base}..HEAD", "--", *paths],
                         cwd=root, capture_output=True, text=True, timeout=60, check=True)
    return tuple(commit for commit in out.stdout.split() if _changes_code(commit, paths, root))


def _changes_code(commit: str, paths: tuple[str, ...], root: Path) -> bool:
    """Whether COMMIT changes what runs in PATHS: a commit that only rewrites docstrings and
    comments of Python files there does not (_same_code.py); any other file it touches there does."""
    out = subprocess.run(["git", "diff-tree", "--no-commit-id", "--name-only", "-r", commit, "--", *paths],
                         cwd=root, capture_output=True, text=True, timeout=60)
    names = out.stdout.split("\n") if out.returncode == 0 else []
    names = [name for name in names if name]
    if not names:
        return True  # (a first commit, or a merge: not read apart, so counted)
    for name in names:
        if not name.endswith(".py"):
            return True
        before, after = _text_at(f"{commit}^", name, root), _text_at(commit, name, root)
        if before is None or after is None or not same_code(before, after):
            return True
    return False


def _text_at(commit: str, path: str, root: Path) -> str | None:
    out = subprocess.run(["git", "show", f"{commit}:{path}"], cwd=root, capture_output=True, timeout=60)
    if out.returncode != 0:
        return None  # added or removed by the commit
    return out.stdout.decode("utf-8", errors="replace")


def facts_for(documents: list[dict], root: Path = ROOT) -> dict[tuple[str, int], RowFacts]:
    """RowFacts for every (benchmark, row index), inputs judged before the files derived from them."""
    by_name = {d["benchmark"]: d for d in documents}
    facts: dict[tuple[str, int], RowFacts] = {}
    plain = [d for d in documents if not _inputs(d)]
    for document in plain + [d for d in documents if _inputs(d)]:
        inputs = [name for name in _inputs(document) if name in by_name]
        newer = _newer(document, {name: latest_when(by_name[name]) for name in inputs})
        refused = tuple(name for name in inputs if _any_refused(by_name[name], facts))
        paths = measured_paths(document, root)
        for index, row in enumerate(document.get("rows", [])):
            commit = row_machine(document, row).get("gpusession_commit")
            since = changes_since(commit, paths, root) if commit else None
            facts[(document["benchmark"], index)] = RowFacts(commit, since, newer, refused)
    return facts


def _inputs(document: dict) -> tuple[str, ...]:
    recorded = document.get("derived_from")
    if recorded is not None:
        return tuple(recorded)
    return DEFAULT_DERIVED_FROM.get(document["benchmark"], ())


def _newer(document: dict, inputs_when: dict[str, str]) -> tuple[str, ...]:
    recorded = document.get("derived_from")
    return newer_inputs(latest_when(document), recorded if isinstance(recorded, dict) else None, inputs_when)


def _any_refused(document: dict, facts: dict) -> bool:
    """Whether an input has a row refused for its history (a missed goal does not taint a file
    derived from it)."""
    return any(judge(_without_goal(row), facts[(document["benchmark"], i)])
               for i, row in enumerate(document.get("rows", [])) if (document["benchmark"], i) in facts)


def _without_goal(row: dict) -> dict:
    return {key: value for key, value in row.items() if key != "goal"}
