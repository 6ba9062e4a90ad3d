"""Bad options raise before anything is leased, naming the option and what to do."""
from __future__ import annotations

import pytest

import gpusession as gs
from gpusession.run.caller.options import validate_lease_options, parse_duration, validate_run_options


@pytest.mark.parametrize(
    "options, error, names",
    [
        ({"gpus": 0}, ValueError, "gpus must be more than 0"),
        ({"gpus": -1}, ValueError, "gpus must be more than 0"),
        ({"gpus": "two"}, TypeError, "gpus must be a number of GPUs"),
        ({"gpus": True}, TypeError, "gpus must be a number of GPUs"),
        ({"gpus": float("nan")}, ValueError, "gpus must be more than 0"),
        ({"gpus": 2, "gpus_per_worker": 3}, ValueError, "whole multiple of gpus_per_worker"),
        ({"gpus": 3, "gpus_per_worker": 2}, ValueError, "Try gpus=4"),
        ({"gpus": 2, "gpus_per_worker": 1.5}, ValueError, "gpus_per_worker must be a fraction"),
        ({"gpus": 2, "min_gpus": 3}, ValueError, "min_gpus (3) must not exceed gpus"),
        ({"gpus": 4, "gpus_per_worker": 2, "min_gpus": 1}, ValueError, "min_gpus (1) must be a whole multiple"),
        ({"priority": "urgent"}, ValueError, "priority must be one of 'low', 'normal', 'high'"),
        ({"timeout": -5}, ValueError, "timeout must be more than 0 seconds"),
        ({"timeout": "5 minutes"}, ValueError, "timeout must be seconds or a string like '90s'"),
        ({"queue_timeout": 0}, ValueError, "queue_timeout must be more than 0"),
        ({"backend": "mpi"}, ValueError, "backend must be None, 'nccl' or 'gloo'"),
        ({"gpus": 1, "gpus_per_worker": 0.5, "backend": "nccl"}, ValueError, "nccl cannot put two ranks on one GPU"),
        ({"placement": "anywhere"}, ValueError, "placement must be one of 'pack'"),
        ({"max_failures": -1}, ValueError, "max_failures must be a whole number"),
        ({"return_all": "yes"}, TypeError, "return_all must be True or False"),
        ({"runtime_env": ["pip"]}, TypeError, "runtime_env must be a dict"),
    ],
)
def test_invalid_option_is_rejected_naming_it(options, error, names):
    with pytest.raises(error) as raised:
        gs.distributed(**options)(lambda: None)
    assert names in str(raised.value)


def test_unknown_option_name_is_rejected_with_the_list_of_options():
    with pytest.raises(TypeError, match="unknown option 'gpu'; the options are gpus, gpus_per_worker"):
        gs.distributed(gpu=2)


def test_invalid_options_lease_nothing_because_they_fail_before_connecting(monkeypatch):
    from gpusession.cluster import raycluster
    from gpusession.broker import client

    def must_not_connect(*args, **kwargs):
        raise AssertionError("connected to Ray for an invalid option")

    monkeypatch.setattr(raycluster, "ensure_connected", must_not_connect)
    monkeypatch.setattr(client, "broker", must_not_connect)
    with pytest.raises(ValueError, match="gpus must be more than 0"):
        gs.distributed(gpus=0)  # at decoration, before the function is ever called
    with pytest.raises(ValueError, match="gpus must be more than 0"):
        gs.lease(gpus=0)


@pytest.mark.parametrize("text, seconds", [(90, 90.0), ("90s", 90.0), ("10m", 600.0), ("2h", 7200.0),
                                           ("1.5h", 5400.0), ("250ms", 0.25), (None, None)])
def test_durations_accept_seconds_and_unit_strings(text, seconds):
    assert parse_duration(text, field_name="timeout") == seconds


def test_units_workers_fractions_and_elastic_bounds():
    lease = validate_lease_options(gpus=2, gpus_per_worker=0.5, min_gpus=1)
    assert lease.workers == 4 and lease.min_workers == 2
    assert validate_run_options(gpus=4, gpus_per_worker=2).lease.workers == 2
    assert validate_run_options(gpus=2).lease.min_workers is None  # min_gpus defaults to gpus: not elastic
    assert validate_run_options(gpus=2, min_gpus=2).lease.min_workers is None


def test_an_elastic_run_keeps_its_bounds_in_workers():
    options = validate_run_options(gpus=4, min_gpus=2)
    assert (options.lease.workers, options.lease.min_workers) == (4, 2)


def test_decorator_works_with_and_without_parentheses():
    def f():
        return 1

    assert gs.distributed(f).options.lease.gpus == 1
    assert gs.distributed(gpus=2)(f).options.lease.gpus == 2
    assert gs.distributed(gpus=2)(f).__name__ == "f"
