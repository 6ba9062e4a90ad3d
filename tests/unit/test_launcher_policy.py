"""Whom the root launcher starts a rank as, and who may ask it (gpusession/launcher/policy.py),
and which GPU device files a rank's cgroup hides (launcher/cgroups.py): pure decisions."""
from __future__ import annotations

from gpusession.launcher.cgroups import device_denials, gpu_indices
from gpusession.launcher.policy import Account, Rules, peer_allowed, refusal

RULES = Rules(service_uid=998, min_uid=1000)


def _account(name: str, uid: int) -> Account:
    return Account(name, uid, uid, f"/home/{name}")


def test_a_person_above_the_floor_is_started_as_themselves():
    assert refusal("bob", _account("bob", 1001), RULES, "node-a") is None
    assert refusal("ann", _account("ann", 1000), RULES, "node-a") is None  # the floor itself is a person


def test_root_the_service_account_and_system_accounts_are_refused_naming_user_and_node():
    said = refusal("root", _account("root", 0), RULES, "node-a")
    assert "'root'" in said and "node-a" in said and "never runs a rank as root" in said
    said = refusal("gpusession", _account("gpusession", 998), RULES, "node-a")
    assert "'gpusession'" in said and "service account" in said and "node-a" in said
    said = refusal("daemon", _account("daemon", 1), RULES, "node-a")
    assert "'daemon'" in said and "below the launcher's floor 1000" in said and "--min-uid" in said


def test_a_configured_floor_lets_lower_uids_in_but_never_root_or_the_service():
    rules = Rules(service_uid=998, min_uid=500)
    assert refusal("carl", _account("carl", 600), rules, "n") is None
    assert refusal("carl", _account("carl", 499), rules, "n") is not None
    assert refusal("root", _account("root", 0), Rules(service_uid=998, min_uid=0), "n") is not None
    assert refusal("svc", _account("svc", 998), Rules(service_uid=998, min_uid=0), "n") is not None


def test_an_unknown_user_or_no_name_is_refused_naming_the_node():
    said = refusal("zed", None, RULES, "node-b")
    assert "'zed' does not exist on node node-b" in said and "every node" in said
    assert "no account was named" in refusal("", None, RULES, "node-b")


def test_only_the_service_account_may_connect():
    assert peer_allowed(998, RULES)
    assert not peer_allowed(0, RULES)  # not even root: nothing but the worker actors asks it
    assert not peer_allowed(1001, RULES)


def test_a_rank_sees_only_its_own_gpu_device_files_where_they_are_constrained():
    present = ["nvidia0", "nvidia1", "nvidia2", "nvidiactl", "nvidia-uvm", "null"]
    assert device_denials(present, ("1",)) == ["c 195:0 rwm", "c 195:2 rwm"]
    assert device_denials(present, ("0", "1", "2")) == []
    assert device_denials(present, None) == []  # logical GPUs: nothing to constrain
    assert gpu_indices(("0", "3")) == ("0", "3")
    assert gpu_indices(("GPU-1f2e",)) is None and gpu_indices(()) is None


def test_the_launcher_starts_again_with_nothing_but_path_and_language_in_its_environment():
    from gpusession.launcher.__main__ import clean_environment

    assert clean_environment({"PATH": "/bin", "LANG": "C.UTF-8", "RAY_AUTH_TOKEN": "t"}) == {"PATH": "/bin", "LANG": "C.UTF-8"}
    assert clean_environment({"PATH": "/bin"}) is None  # clean already: no exec


def test_a_refused_launch_reaches_the_caller_as_launch_refused_naming_user_and_node(monkeypatch):
    """What ray.get raises in the caller when rank 0's actor could not start the store as the
    caller's account: the launcher's own reason, as a GPUSessionError, not Ray's wrapper."""
    import pytest
    import ray

    from gpusession.errors import GPUSessionError, LaunchRefused
    from gpusession.run.caller import controller

    reason = "The launcher refused to start the rank: the user 'zed' does not exist on node gpu-3 (...)."

    class Actor:
        class open_rendezvous:
            @staticmethod
            def remote(*args):
                return args

    monkeypatch.setattr(controller.ray, "get", lambda _ref: (_ for _ in ()).throw(
        ray.exceptions.RayTaskError("open_rendezvous", "", LaunchRefused(reason)).as_instanceof_cause()))
    with pytest.raises(GPUSessionError) as raised:
        controller._open_rendezvous(Actor, 2, 60.0, "zed")
    assert type(raised.value) is LaunchRefused and str(raised.value) == reason


def test_an_account_in_group_root_or_the_services_group_is_refused_naming_the_group():
    rules = Rules(service_uid=998, min_uid=1000, service_gid=997)
    said = refusal("eve", Account("eve", 1002, 1002, "/home/eve", frozenset({1002, 0})), rules, "node-a")
    assert "'eve'" in said and "group root (gid 0)" in said and "node-a" in said
    said = refusal("eve", Account("eve", 1002, 0, "/home/eve"), rules, "node-a")  # root as her primary group
    assert "group root" in said
    said = refusal("eve", Account("eve", 1002, 1002, "/home/eve", frozenset({1002, 997})), rules, "node-a")
    assert "service account's group (gid 997)" in said
    assert refusal("eve", Account("eve", 1002, 1002, "/home/eve", frozenset({1002, 27})), rules, "node-a") is None
