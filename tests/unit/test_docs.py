"""The README stays a short front page and every page of the documentation site can be reached.

`scripts/docs` (Sphinx with -W) fails on a broken internal link or an orphan page as well; these
checks run in the fast loop, without Sphinx."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
MAX_README_LINES = 150
TOCTREE = re.compile(r"```\{toctree\}\n(.*?)```", re.S)
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _pages() -> set[str]:
    pages = set()
    for path in DOCS.rglob("*"):
        skipped = {"_build", "_ext", "jupyter_execute"} & set(path.parts)
        if path.suffix in (".md", ".ipynb") and not skipped:
            pages.add(path.relative_to(DOCS).with_suffix("").as_posix())
    return pages


def _toctree_entries(page: str) -> list[str]:
    text = (DOCS / f"{page}.md").read_text() if (DOCS / f"{page}.md").exists() else ""
    folder = Path(page).parent
    entries = []
    for block in TOCTREE.findall(text):
        for line in block.splitlines():
            line = line.strip()
            if line and not line.startswith(":"):
                entries.append((folder / line).as_posix())
    return entries


def test_the_readme_is_a_short_front_page():
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines: move detail to docs/"


def test_the_readmes_first_commands_set_up_and_run_the_demo_and_every_test():
    text = README.read_text()
    first_block = text[text.index("```bash"):]
    first_block = first_block[:first_block.index("```", 3)]
    assert "scripts/setup && .venv/bin/gpusession lab" in first_block
    assert ".venv/bin/gpusession demo" in first_block
    assert ".ci/run" in first_block


def test_every_docs_page_is_in_a_toctree_reachable_from_the_index():
    pages = _pages()
    reached, todo = {"index"}, ["index"]
    while todo:
        for entry in _toctree_entries(todo.pop()):
            assert entry in pages, f"a toctree names {entry}, which is no page of docs/"
            if entry not in reached:
                reached.add(entry)
                todo.append(entry)
    assert pages - reached == set(), f"pages in no toctree: {sorted(pages - reached)}"


def test_every_relative_link_of_the_readme_and_contributing_names_a_file_that_exists():
    for doc in (README, ROOT / "CONTRIBUTING.md"):
        for target in LINK.findall(doc.read_text()):
            if "://" in target:
                continue
            assert (doc.parent / target).exists(), f"{doc.name} links to {target}, which is missing"


def test_ci_builds_the_docs_before_the_tests_with_the_documented_command():
    script = ROOT / "scripts" / "docs"
    assert script.exists() and script.stat().st_mode & 0o111, "scripts/docs builds the docs"
    assert "-W" in script.read_text(), "the docs build treats warnings as errors"
    ci = (ROOT / ".ci" / "run").read_text()
    assert "scripts/docs" in ci, ".ci/run builds the docs"
    assert ci.index("scripts/docs") < ci.index("pytest"), ".ci/run builds the docs before pytest"
