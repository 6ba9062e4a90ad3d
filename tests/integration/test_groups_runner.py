"""tests/groups.py for real: the two pytest sessions `.ci/run` starts at once, collecting only."""
from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

from ..conftest import ROOT


def collected(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=240)


def test_the_two_sessions_collect_every_test_once_name_their_lines_and_remove_their_own_tmp():
    both = collected(["-m", "tests.groups", "--collect-only"])
    alone = collected(["-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only", "tests"])
    assert both.returncode == 0 and alone.returncode == 0, both.stdout[-3000:] + both.stderr[-3000:]

    lines = both.stdout.splitlines()
    tmp = re.search(r"integration \(pid \d+, TMPDIR=(\S+)\)", lines[0]).group(1)
    assert Path(tmp).parent == Path(tempfile.gettempdir()) and not Path(tmp).exists()  # made and removed
    ids = {name: {line.split("] ", 1)[1] for line in lines if line.startswith(f"[{name}] tests/")}
           for name in ("integration", "the rest")}
    assert ids["integration"] and all(i.startswith("tests/integration/") for i in ids["integration"])
    assert ids["the rest"] and not any(i.startswith("tests/integration/") for i in ids["the rest"])
    every = {line for line in alone.stdout.splitlines() if line.startswith("tests/")}
    assert ids["integration"] | ids["the rest"] == every
    assert lines[-2].startswith("integration: exit status 0 after 0:") and "tests collected" in lines[-2]
    assert lines[-1].startswith("the rest: exit status 0 after ") and f"{len(ids['the rest'])} tests collected" in lines[-1]
