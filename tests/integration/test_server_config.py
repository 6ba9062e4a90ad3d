"""The server's configuration and request parsing, without a server: every c.GPUSession trait
documents itself, bad values are refused at load (domain errors' statuses: tests/unit/test_refusals_and_incidents.py)."""
from __future__ import annotations

import re

import pytest
from traitlets import TraitError
from traitlets.config import Config

from jupyter_ext import params
from jupyter_ext.config import GPUSession
from jupyter_ext.kernelenv import kernel_environment

TRAITS = sorted(GPUSession.class_own_traits(config=True))


@pytest.mark.parametrize("name", TRAITS)
def test_every_trait_says_its_example_its_default_and_what_it_does_not_enforce(name):
    text = " ".join(GPUSession.class_own_traits()[name].help.split())
    assert re.search(r"e\.g\.", text), f"{name}: no example"
    assert re.search(r"\(the default|Default:|Empty:|0:", text), f"{name}: does not say what the default/empty means"
    assert re.search(r"\bnot\b|\bnever\b|\bNever\b|\bcannot\b", text), f"{name}: does not say what it does not do"


def test_the_server_has_exactly_these_eleven_settings():
    assert set(TRAITS) == {"ray_address", "local_gpus", "admin_users", "admin_token", "metrics_public", "db_path",
                           "default_quota", "allow_borrowing", "preemption_grace_s", "require_signed_identity",
                           "run_activity_s"}  # issue 32: a live run keeps its server from the hub's culler


@pytest.mark.parametrize("name, value", [
    ("ray_address", "my laptop"), ("ray_address", "10.0.0.5"), ("local_gpus", -1), ("default_quota", {"max_gpus": -2}),
    ("default_quota", {"gpus": 2}), ("default_quota", {"max_priority": "urgent"}), ("preemption_grace_s", -1.0),
    ("run_activity_s", 0.5),
])
def test_bad_config_is_refused_when_the_server_loads_it_naming_the_trait(name, value):
    with pytest.raises(TraitError, match=f"GPUSession.{name}"):
        GPUSession(config=Config({"GPUSession": {name: value}}))


def test_only_configured_policy_is_handed_to_the_broker():
    options = GPUSession(config=Config({"GPUSession": {"allow_borrowing": False, "default_quota": {"max_gpus": 2}}}))
    assert options.broker_policy() == {"allow_borrowing": False, "default_quota": {"max_gpus": 2}}


def test_the_owner_is_the_admin_of_an_embedded_cluster_and_nobody_is_by_default_on_a_shared_one(monkeypatch):
    monkeypatch.setenv("GPUSESSION_USER", "olga")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert GPUSession().admin_users == {"olga"}
    assert GPUSession(config=Config({"GPUSession": {"ray_address": "10.0.0.5:6379"}})).admin_users == set()


def test_kernels_never_inherit_the_admin_token():
    env = kernel_environment({"PATH": "/bin", "GPUSESSION_ADMIN_TOKEN": "secret"}, {"GPUSESSION_USER": "alice"})
    assert env == {"PATH": "/bin", "GPUSESSION_USER": "alice"}


def test_usage_times_are_unix_seconds_or_iso_dates_in_utc():
    assert params.moment("since", "1717200000") == 1717200000.0
    assert params.moment("since", "2024-06-01") == params.moment("since", "2024-06-01T00:00:00Z") == 1717200000.0
    assert params.moment("since", "") is None
    with pytest.raises(ValueError, match="since must be"):
        params.moment("since", "last week")
