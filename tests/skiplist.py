"""No silent skip: which skips a run may have (tests/expected_skips.toml) and which it had.

Pure, so tests/unit/test_skiplist.py checks the rule without running a suite. The hooks that feed
it are in tests/conftest.py: when CI runs as root (CI=true, uid 0), a skip that is not listed with
its reason fails the session."""
from __future__ import annotations

import fnmatch
import tomllib
from dataclasses import dataclass
from pathlib import Path

LIST = Path(__file__).with_name("expected_skips.toml")


@dataclass(frozen=True)
class Allowed:
    tests: str  # fnmatch pattern on the test id relative to tests/
    reason: str  # must appear in the skip's message


@dataclass(frozen=True)
class Skipped:
    test: str  # test id relative to tests/, e.g. "gpu/test_gpu.py::test_nccl_at_one_rank"
    reason: str


def load(text: str) -> list[Allowed]:
    """The allowed skips of a TOML text; ValueError naming the entry when one lacks a field."""
    entries = tomllib.loads(text).get("skip", [])
    allowed = []
    for number, entry in enumerate(entries, 1):
        tests, reason = entry.get("tests"), entry.get("reason")
        if not isinstance(tests, str) or not tests or not isinstance(reason, str) or not reason.strip():
            raise ValueError(f"expected_skips.toml entry {number} needs both `tests` (a pattern) and `reason` "
                             f"(the words its skip message says); got {entry!r}")
        allowed.append(Allowed(tests, reason.strip()))
    return allowed


def enforced(env: dict, uid: int) -> bool:
    """Skips fail the run only in CI (CI=true) as root, where every test can run."""
    return env.get("CI", "").strip().lower() in ("true", "1", "yes") and uid == 0


def unexplained(skipped: list[Skipped], allowed: list[Allowed]) -> list[Skipped]:
    """The skips no entry allows: none matches the test, or none of those says its reason."""
    return [s for s in skipped
            if not any(fnmatch.fnmatchcase(s.test, a.tests) and a.reason in s.reason for a in allowed)]


def report(bad: list[Skipped]) -> str:
    lines = [f"{len(bad)} test(s) skipped without being listed in tests/expected_skips.toml (CI as root must "
             "run every test; list a skip there with its reason only if this machine cannot run it):"]
    lines += [f"  {s.test}: {s.reason}" for s in bad]
    return "\n".join(lines)
