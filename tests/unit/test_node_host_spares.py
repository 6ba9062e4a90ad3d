"""How many spare workers a node's host keeps: one per GPU of the node, at least one, at most
MAX_DEFAULT_SPARES, unless GPUSESSION_SPARE_WORKERS says otherwise; a bad value is refused
naming the variable."""
from __future__ import annotations

import pytest

from gpusession.run.nodehost import MAX_DEFAULT_SPARES, SPARES_ENV, default_spares


@pytest.mark.parametrize("gpus, spares", [(0, 1), (0.5, 1), (2, 2), (2.5, 3), (4, 4), (64, MAX_DEFAULT_SPARES)])
def test_one_spare_per_gpu_within_bounds(monkeypatch, gpus, spares):
    monkeypatch.delenv(SPARES_ENV, raising=False)
    assert default_spares(gpus) == spares


def test_the_variable_sets_the_number_and_zero_turns_spares_off(monkeypatch):
    monkeypatch.setenv(SPARES_ENV, "0")
    assert default_spares(8) == 0
    monkeypatch.setenv(SPARES_ENV, "12")
    assert default_spares(1) == 12


@pytest.mark.parametrize("value", ["many", "-1", "2.5"])
def test_a_bad_value_is_refused_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv(SPARES_ENV, value)
    with pytest.raises(ValueError, match=f"{SPARES_ENV}='{value}' must be a whole number"):
        default_spares(4)
