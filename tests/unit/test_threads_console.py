"""What calls from several threads of one process show and keep apart: each thread's `last_run`,
and console lines labelled by call while calls overlap (pure: no Ray)."""
from __future__ import annotations

import io
import threading

from gpusession.observe.console import ConsoleObserver
from gpusession.observe.events import RunInfo
from gpusession.api.distributed import DistributedFunction, parse_options


def test_each_thread_sees_its_own_last_run_and_a_thread_that_made_no_call_the_latest_of_any():
    fn = DistributedFunction(lambda: None, parse_options({"gpus": 1}, where="test"))
    mine = {}
    noted, go_on = threading.Event(), threading.Event()

    def caller(name):
        info = RunInfo()
        fn._note(info, ((name,), {}))
        noted.set()
        go_on.wait(10)  # the other thread notes its call after this one
        mine[name] = (info, fn.last_run)

    first = threading.Thread(target=caller, args=("first",))
    first.start()
    assert noted.wait(10)
    second_info = RunInfo()
    second = threading.Thread(target=lambda: (fn._note(second_info, (("second",), {})),
                                              mine.setdefault("second", (second_info, fn.last_run))))
    second.start()
    second.join(10)
    go_on.set()
    first.join(10)
    assert mine["first"][1] is mine["first"][0]  # not the second thread's, which started later
    assert mine["second"][1] is second_info
    assert fn.last_run is second_info  # this thread made no call: the latest of any thread


def _lines(out: io.StringIO) -> list[str]:
    return out.getvalue().splitlines()


def test_console_lines_of_calls_that_overlap_carry_their_call_and_a_lone_call_stays_plain():
    out, err = io.StringIO(), io.StringIO()
    a, b = ConsoleObserver(1, stdout=out, stderr=err), ConsoleObserver(1, stdout=out, stderr=err)
    a.requesting(1, 1)
    a.output(0, "stdout", "alone\n")
    b.requesting(1, 1)
    a.output(0, "stdout", "a's line\n")
    b.output(0, "stdout", "b's li")
    b.output(0, "stdout", "ne\n")
    a.finished(RunInfo(), None)
    b.output(0, "stdout", "b after a\n")  # b ran beside a: it keeps its label to its end
    b.finished(RunInfo(), None)
    assert _lines(out) == ["alone", f"[call {a.number}] a's line", f"[call {b.number}] b's line",
                           f"[call {b.number}] b after a"]
    receipts = _lines(err)
    assert receipts[0].startswith(f"[call {a.number}] gpusession: done")
    assert receipts[-1].startswith(f"[call {b.number}] gpusession: done")

    lone = io.StringIO()
    c = ConsoleObserver(1, stdout=lone, stderr=lone)
    c.requesting(1, 1)
    c.output(0, "stdout", "just me\n")
    c.finished(RunInfo(), None)
    assert _lines(lone)[0] == "just me" and _lines(lone)[-1].startswith("gpusession: done")


def test_a_lease_released_without_a_run_leaves_later_calls_unlabelled():
    """`gs.lease(...)` asks (`requesting`) and may be released without any run, so no `finished`
    comes: its release ends it. Before, it stayed counted as going, and every later call of the
    process printed `[call N]` on each line as if it overlapped another (seen in CI: a console
    test after a test that held and released a lease)."""
    out = io.StringIO()
    held = ConsoleObserver(1, stdout=out, stderr=out)
    held.requesting(1, 1)
    held.released(RunInfo())
    failed = ConsoleObserver(1, stdout=out, stderr=out)
    failed.requesting(1, 1)  # a request that failed before the broker answered ends the same way
    failed.released(RunInfo())
    later = ConsoleObserver(1, stdout=out, stderr=out)
    later.requesting(1, 1)
    later.output(0, "stdout", "plain\n")
    later.finished(RunInfo(), None)
    assert _lines(out)[0] == "plain" and _lines(out)[-1].startswith("gpusession: done")
