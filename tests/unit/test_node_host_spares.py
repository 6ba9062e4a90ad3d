"""How many spare workers a node's host keeps: one per GPU of the node, at least one, at most
MAX_DEFAULT_SPARES, unless GPUSESSION_SPARE_WORKERS says otherwise; a bad value is refused
naming the variable. And when it starts them (with its prober): on a cold node only once no
worker was asked for QUIET_S, at once on a host that was quiet before."""
from __future__ import annotations

import pytest

from gpusession.run.node.nodehost import MAX_DEFAULT_SPARES, QUIET_S, SPARES_ENV, default_spares, spares_due


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


def test_a_cold_host_starts_no_spare_while_its_first_call_keeps_asking_for_workers():
    # Asked 1 s ago, and just before the quiet time is up: the first call is still starting.
    assert not spares_due(now=101.0, last_request=100.0, settled=False, asking=0)
    assert not spares_due(now=100.0 + QUIET_S - 0.01, last_request=100.0, settled=False, asking=0)


def test_a_cold_host_starts_its_spares_once_nobody_asked_for_a_worker_for_the_quiet_time():
    assert spares_due(now=100.0 + QUIET_S, last_request=100.0, settled=False, asking=0)


def test_quiet_counts_from_the_last_request_not_from_the_hosts_start():
    """A host started at 0 whose first call asks for workers at 30 (a loaded machine: the
    call probed its bundles first) is still cold at 31."""
    assert not spares_due(now=31.0, last_request=30.0, settled=False, asking=0)


def test_a_request_still_waiting_for_its_worker_keeps_a_cold_host_from_being_quiet():
    """Its spare may take a minute to start on a loaded node: the first call is still starting."""
    assert not spares_due(now=100.0 + 60.0, last_request=100.0, settled=False, asking=1)


def test_a_settled_host_replaces_a_spare_handed_out_at_once():
    assert spares_due(now=500.0, last_request=500.0, settled=True, asking=1)


def test_a_host_this_kernel_just_started_is_not_asked_to_probe_it_has_no_prober_yet():
    from gpusession.run.caller.pool import too_young_to_probe

    assert too_young_to_probe(started=100.0, now=100.5)
    assert not too_young_to_probe(started=100.0, now=100.0 + QUIET_S)
    assert not too_young_to_probe(started=None, now=100.5)  # found running: it answers at once
