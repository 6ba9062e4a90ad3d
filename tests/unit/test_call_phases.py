"""benchmarks/_call_phases.py: a warm call's phases come from its marks and add up to its wall
clock, with each boundary set by the slowest rank."""
from __future__ import annotations

import time

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


def test_a_process_start_time_is_when_this_process_was_created():
    psutil = pytest.importorskip("psutil")
    started = call_phases.process_start_time()
    assert started <= time.time()
    assert started == pytest.approx(psutil.Process().create_time(), abs=0.05)
