"""A speed row is judged against the code it measures and every module of the project that code
imports (benchmarks/_import_closure.py, read from the source): a change to gpusession/observe,
which the run path imports, makes a warm-call row stale although its file names only
gpusession/run and the rest of the run path."""
from __future__ import annotations

import subprocess
from pathlib import Path

from ..conftest import ROOT
from .test_speed_table import MACHINE, load

closure = load("_import_closure")
git_facts = load("_git_facts")
freshness = load("_freshness")

TREE = {
    "gpusession/__init__.py": "",
    "gpusession/run/__init__.py": "",
    "gpusession/run/call.py": "import torch\n\ndef call():\n    from ..observe import view  # lazily, as the run path does\n",
    "gpusession/observe/__init__.py": "",
    "gpusession/observe/view.py": "from gpusession.errors import Failed\nfrom . import *\n",
    "gpusession/errors.py": "class Failed(Exception):\n    pass\n",
    "gpusession/hub/__init__.py": "",
    "gpusession/hub/plan.py": "from ..run import call\n",  # imports the run path; the run path does not import it
    "gpusession/run/broken.py": "def (:\n",  # unparsable: imports nothing, breaks nothing
}


def _tree(root: Path) -> Path:
    for name, text in TREE.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_the_modules_a_measured_folder_imports_at_any_depth_or_inside_a_function_are_its_closure(tmp_path):
    assert closure.imported_paths(_tree(tmp_path), ("gpusession/run",)) == (
        "gpusession/__init__.py", "gpusession/errors.py", "gpusession/observe/__init__.py", "gpusession/observe/view.py")


def test_the_run_paths_closure_holds_what_it_imports_from_other_folders_and_not_the_hub():
    found = closure.imported_paths(ROOT, freshness.DEFAULT_MEASURES)
    assert {"gpusession/errors.py", "gpusession/observe/events.py", "gpusession/_version.py"} <= set(found)
    assert [path for path in found if path.startswith(("gpusession/hub/", "gpusession/cli/"))] == []
    assert [path for path in found if path.startswith(freshness.DEFAULT_MEASURES)] == []  # named already


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout.strip()


def _commit(root: Path, message: str) -> str:
    _git(root, "add", "-A")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", message)
    return _git(root, "rev-parse", "--short=7", "HEAD")


def _measured_history(tmp_path: Path) -> tuple[Path, dict]:
    """A git history whose first commit a warm-call row of gpusession/run was measured at."""
    root = _tree(tmp_path)
    (root / "benchmarks").mkdir()
    (root / "benchmarks" / "warm.py").write_text("# the benchmark script\n")
    _git(root, "init", "-q")
    measured_at = _commit(root, "measured")
    return root, {"benchmark": "warm", "measures": ["gpusession/run"],
                  "machine": {**MACHINE, "gpusession_commit": measured_at},
                  "rows": [{"measure": "warm call", "unit": "s", "gpusession": 0.2, "gpusession_samples": [0.2] * 5}]}


def test_a_row_is_stale_after_a_change_to_a_module_its_measured_code_imports_not_after_one_it_does_not(tmp_path):
    root, document = _measured_history(tmp_path)

    (root / "gpusession" / "hub" / "plan.py").write_text("from ..run import call  # a comment\n")
    _commit(root, "the hub only")
    assert git_facts.facts_for([document], root)[("warm", 0)].changes_since == ()

    (root / "gpusession" / "observe" / "view.py").write_text("from gpusession.errors import Failed  # changed\n")
    observed = _commit(root, "what the run path imports")
    git_facts.changes_since.cache_clear()  # the report reads one history per run; this is a new one
    facts = git_facts.facts_for([document], root)[("warm", 0)]
    assert facts.changes_since == (observed,)
    assert [finding.mark for finding in freshness.judge(document["rows"][0], facts)] == \
        [f"stale since {observed}: re-measure"]


same_code = load("_same_code").same_code


def test_docstrings_comments_and_layout_are_not_code_and_anything_else_is():
    before = '"""The module."""\nimport os\n\nclass A:\n    """A class."""\n    def f(self):\n        """Says 1."""\n        return 1\n'
    prose = '"""The module, said again."""\nimport os  # a comment\n\n\nclass A:\n    """Another word."""\n\n    def f(self):\n        return 1\n'
    assert same_code(before, prose)
    assert same_code("def f():\n    pass\n", 'def f():\n    "Nothing yet."\n')
    assert not same_code(before, before.replace("return 1", "return 2"))
    assert not same_code(before, before.replace('"""Says 1."""', 'print("Says 1.")'))  # a call, not a docstring
    assert not same_code("x = 'a'\n", "x = 'b'\n")  # a string that is data
    assert not same_code(before, "def (:\n")  # unparsable: not known to be the same


def test_a_commit_that_only_rewrites_docstrings_and_comments_leaves_a_row_current_and_a_code_change_does_not(tmp_path):
    root, document = _measured_history(tmp_path)

    (root / "gpusession" / "errors.py").write_text('"""What fails."""\nclass Failed(Exception):  # the one\n    pass\n')
    (root / "benchmarks" / "warm.py").write_text('"""The benchmark script, documented."""\n')
    _commit(root, "prose only, in the measured closure and the script")
    git_facts.changes_since.cache_clear()
    assert git_facts.facts_for([document], root)[("warm", 0)].changes_since == ()

    (root / "gpusession" / "errors.py").write_text('"""What fails."""\nclass Failed(RuntimeError):\n    pass\n')
    code = _commit(root, "code")
    git_facts.changes_since.cache_clear()
    assert git_facts.facts_for([document], root)[("warm", 0)].changes_since == (code,)
