"""The link relay's decisions (tests/multihost/linkrelay.py): how long each frame is held and
which are lost, per direction, from a seeded stream; bad settings refused naming the field."""
from __future__ import annotations

import math

import pytest

from tests.multihost.linkrelay import Impairment, RelayCounts, Schedule

FRAMES = 100_000


def fates(impairment: Impairment, direction: int = 0, frames: int = FRAMES) -> list[float | None]:
    schedule = Schedule(impairment, direction)
    return [schedule.due(float(i)) for i in range(frames)]


def test_every_frame_is_held_exactly_the_delay_and_none_is_lost_without_loss():
    assert fates(Impairment(delay_ms=20)) == [i + 0.020 for i in range(FRAMES)]


def test_about_the_given_fraction_of_frames_is_lost():
    loss = 0.01
    lost = fates(Impairment(delay_ms=20, loss=loss, seed=3)).count(None)
    spread = 5 * math.sqrt(FRAMES * loss * (1 - loss))  # five binomial standard deviations
    assert abs(lost - FRAMES * loss) < spread, f"{lost} of {FRAMES} lost; expected {FRAMES * loss:g} +- {spread:.0f}"


def test_frames_that_pass_keep_their_order():
    passed = [due for due in fates(Impairment(delay_ms=5, loss=0.3, seed=1)) if due is not None]
    assert passed == sorted(passed)


def test_the_same_seed_loses_the_same_frames_and_the_two_directions_lose_apart():
    impairment = Impairment(loss=0.05, seed=7)
    assert fates(impairment) == fates(impairment)
    assert fates(impairment, direction=0) != fates(impairment, direction=1)
    assert fates(impairment) != fates(Impairment(loss=0.05, seed=8))


def test_a_relay_is_needed_only_for_a_delay_or_a_loss():
    assert not Impairment().needed
    assert Impairment(delay_ms=1).needed and Impairment(loss=0.001).needed


@pytest.mark.parametrize("field, value", [("delay_ms", -1.0), ("delay_ms", float("nan")), ("delay_ms", 10_001.0),
                                          ("loss", -0.01), ("loss", 1.0), ("loss", float("nan"))])
def test_a_bad_setting_is_refused_naming_it(field, value):
    with pytest.raises(ValueError, match=rf"^{field} must be .*got {value!r}"):
        Impairment(**{field: value})


def test_the_relays_tally_is_read_once_into_numbers():
    counts = RelayCounts.parse("forwarded 4923 dropped 50\n")
    assert counts == RelayCounts(forwarded=4923, dropped=50) and counts.frames == 4973
    assert RelayCounts.parse("Traceback (most recent call last):") is None
