"""benchmarks/_call_phases.py: a warm call's phases come from its marks and add up to its wall
clock, with each boundary set by the slowest rank."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from .test_speed_table import load

call_phases = load("_call_phases")


def test_the_phases_follow_the_slowest_rank_and_add_up_to_the_call():
    marks = call_phases.Marks(called=100.0, requesting=100.01, queued_s=0.04, placed=100.1,
                              release_started=100.5, released=100.55, returned=100.6,
                              ranks=[{"forked": 100.12, "entered": 100.3, "exited": 100.35},
                                     {"forked": 100.15, "entered": 100.32, "exited": 100.4}])
    got = call_phases.phases(marks)
    assert list(got) == list(call_phases.PHASES)
    assert got == pytest.approx({"lease": 0.05, "placement": 0.05, "fork": 0.05, "rendezvous": 0.17,
                                 "function": 0.08, "return": 0.1, "release": 0.05, "after release": 0.05})
    assert sum(got.values()) == pytest.approx(marks.returned - marks.called)


def test_a_process_start_time_is_when_the_process_was_created_to_a_clock_tick():
    """A child started now says it was created after the parent asked for it (less one 10 ms tick)
    and before it could run a line: not up to a second early, as with /proc/stat's whole-second btime."""
    asked = time.time()
    out = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); import time; "
                          "from _call_phases import process_start_time; print(process_start_time(), time.time())",
                          str(Path(call_phases.__file__).parent)], capture_output=True, text=True, check=True).stdout
    started, running = map(float, out.split())
    assert asked - 0.011 <= started <= running
