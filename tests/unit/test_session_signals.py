"""A test session started in the background by a shell without job control (`pytest ... &` in a
script) inherits SIGINT ignored; the processes its tests start and then stop with SIGINT, as Ctrl-C
(`gpusession hub`, `gpusession lab`), must still get SIGINT's default (tests/conftest.py)."""
from __future__ import annotations

import subprocess
import sys

from ..conftest import ROOT

SAYS_SIGINT = ("import signal; handler = signal.getsignal(signal.SIGINT); "
               "print({signal.SIG_IGN: 'ignored', signal.default_int_handler: 'default'}.get(handler, handler))")
CHILD_SAYS = ("import signal, subprocess, sys\n"
              "signal.signal(signal.SIGINT, signal.SIG_IGN)  # as `pytest ... &` in a script starts\n"
              "LOAD\n"
              f"said = subprocess.run([sys.executable, '-c', {SAYS_SIGINT!r}],\n"
              "                      capture_output=True, text=True, check=True).stdout.strip()\n"
              "print(said)")


def _what_a_started_process_gets(load: str) -> str:
    done = subprocess.run([sys.executable, "-c", CHILD_SAYS.replace("LOAD", load)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip()


def test_a_process_started_from_a_session_begun_with_sigint_ignored_gets_sigints_default():
    assert _what_a_started_process_gets("import tests.conftest") == "default"


def test_without_the_sessions_conftest_such_a_process_would_ignore_sigint():
    assert _what_a_started_process_gets("pass") == "ignored"
