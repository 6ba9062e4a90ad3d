"""Every test, as two pytest sessions at once (`.ci/run`; `.venv/bin/python -m tests.groups`).

Most of a slow test's time is waiting (a cluster, a kernel, a browser or a hub starting, a timeout
it asserts), so two sessions side by side on this 2-core machine end in about half the time of one
(CONTRIBUTING.md, "How long the suite takes"). Each session is what `pytest` alone would be: its
own Ray cluster, hubs and Unix accounts (their names carry the pid or a random part), and the
integration folder its own temporary folder: a fresh folder (mode 1777, as /tmp: the accounts
its tests drop to write there too) given as TMPDIR, which Ray's temporary tree follows as well. So
each session's end-of-run sweep of its temporary folder (tests/conftest.py, `no_folders_left_in_tmp`)
sees only its own clusters' folders, never the other session's live ones. One folder of its own
is enough for that; the other session keeps the machine's temporary folder, as a developer's
`pytest` does.

Arguments go to both sessions (`-x`, `--durations=20`, `-k ...`); each line of output names its
session. The exit status is 0 when both sessions' are, else the larger. The failed tests of each
are in its short summary at the end (pytest's cache is off in both: two sessions writing
`.pytest_cache/v/cache/lastfailed` at once would keep only one's).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTEST = (sys.executable, "-u", "-m", "pytest", "-q", "-p", "no:cacheprovider")  # -u: lines as they come, not 8 KB at a time


@dataclass(frozen=True)
class Group:
    name: str
    paths: tuple[str, ...]  # pytest's arguments that choose the tests
    own_tmp: bool  # a temporary folder of its own as TMPDIR


INTEGRATION = Group("integration", ("tests/integration",), own_tmp=True)
GROUPS = (INTEGRATION, Group("the rest", ("tests", *(f"--ignore={path}" for path in INTEGRATION.paths)), own_tmp=False))


def command(group: Group, extra: list[str]) -> list[str]:
    """PURE: the pytest command line of one group."""
    return [*PYTEST, *extra, *group.paths]


def combined_status(codes: list[int]) -> int:
    """PURE: 0 when every session's exit status is 0, else the largest (pytest: 1 tests failed,
    2 interrupted, 3 internal error, 4 usage error, 5 no test collected)."""
    return max(codes, default=0)


def clock(seconds: float) -> str:
    """PURE: 754.5 -> '12:34'."""
    minutes, rest = divmod(int(round(seconds)), 60)
    return f"{minutes}:{rest:02d}"


RESULT = re.compile(r"\b(passed|failed|errors?|skipped|deselected|xfailed|xpassed|collected|no tests ran)\b.* in [\d.]+s\b")


def is_result(line: str) -> bool:
    """PURE: whether the line is pytest's own last one ("3 passed in 1.20s", "no tests ran in ...")."""
    return bool(RESULT.search(line))


def kept_line(kept: str, line: str) -> str:
    """PURE: the line a session's summary shows after this output line: pytest's result once it
    came (a warning Ray prints at exit after it does not replace it), else the last one not blank."""
    if not line.strip() or (is_result(kept) and not is_result(line)):
        return kept
    return line.rstrip("\n")


def summary_line(group: Group, status: int, seconds: float, last_line: str) -> str:
    """PURE: one session's line at the end: its status, its time, pytest's own last line."""
    return f"{group.name}: exit status {status} after {clock(seconds)} ({last_line.strip(' =') or 'no output'})"


class Session:
    """One group's pytest, started now, its output copied line by line with the group's name."""

    def __init__(self, group: Group, extra: list[str], write_lock: threading.Lock) -> None:
        self.group = group
        self.tmp = self._own_tmp() if group.own_tmp else None
        env = dict(os.environ, **({"TMPDIR": str(self.tmp)} if self.tmp else {}))
        self.started = time.monotonic()
        self.proc = subprocess.Popen(command(group, extra), cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, errors="replace", bufsize=1)
        self.last_line = ""
        self._lock = write_lock
        self._copier = threading.Thread(target=self._copy, name=f"output of {group.name}", daemon=True)
        self._copier.start()

    def _own_tmp(self) -> Path:
        # short: Ray's sockets live at <tmp>/ray/session_<date>_<pid>/sockets/..., 107 bytes at most
        path = Path(tempfile.mkdtemp(prefix=f"gst-{self.group.name[:3]}-"))
        path.chmod(0o1777)
        return path

    def _copy(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.last_line = kept_line(self.last_line, line)
            with self._lock:
                sys.stdout.write(f"[{self.group.name}] {line}")
                sys.stdout.flush()

    def wait(self) -> tuple[int, float]:
        status = self.proc.wait()
        seconds = time.monotonic() - self.started
        self._copier.join()
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)  # the folder this session made, by its name
        return status, seconds


def main(argv: list[str]) -> int:
    lock = threading.Lock()
    sessions = [Session(group, argv, lock) for group in GROUPS]
    print(f"{len(sessions)} pytest sessions at once: " + "; ".join(
        f"{s.group.name} (pid {s.proc.pid}{f', TMPDIR={s.tmp}' if s.tmp else ''})" for s in sessions), flush=True)
    ended = []
    for session in sessions:
        while True:
            try:
                ended.append(session.wait())
                break
            except KeyboardInterrupt:  # Ctrl-C reached both sessions too: wait for their teardown
                continue
    print("", *(summary_line(s.group, status, seconds, s.last_line)
                for s, (status, seconds) in zip(sessions, ended)), sep="\n", flush=True)
    return combined_status([status for status, _ in ended])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
