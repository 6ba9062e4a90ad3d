"""Gloo and nccl are bound to the interface that carries the worker's Ray node IP, unless the
user or the cluster admin already chose one."""
from __future__ import annotations

import logging

from gpusession.cluster.netif import collective_env, interface_for, socket_ifname_env

HOST = {
    "lo": ["127.0.0.1", "::1", "00:00:00:00:00:00"],
    "eth0": ["192.0.2.2", "fe80::fc:ff:fe00:1%eth0", "02:fc:00:00:00:01"],
    "ib0": ["10.213.4.3", "fd00::3"],
}


def test_both_collectives_are_bound_to_the_interface_carrying_the_node_ip():
    assert collective_env("10.213.4.3", {}, HOST) == {"GLOO_SOCKET_IFNAME": "ib0", "NCCL_SOCKET_IFNAME": "=ib0"}


def test_nccl_gets_an_exact_name_so_eth1_never_also_matches_eth10():
    assert collective_env("192.0.2.2", {}, HOST)["NCCL_SOCKET_IFNAME"] == "=eth0"


def test_an_ipv6_node_ip_finds_its_interface_whatever_the_spelling():
    assert interface_for("fd00:0::3", HOST) == "ib0"
    assert interface_for("fe80::fc:ff:fe00:1", HOST) == "eth0"


def test_a_value_the_user_or_admin_set_is_never_overridden():
    env = collective_env("10.213.4.3", {"GLOO_SOCKET_IFNAME": "eth0"}, HOST)
    assert env == {"NCCL_SOCKET_IFNAME": "=ib0"}
    both_set = {"GLOO_SOCKET_IFNAME": "eth0", "NCCL_SOCKET_IFNAME": "^docker"}
    assert collective_env("10.213.4.3", both_set, HOST) == {}


def test_an_empty_value_counts_as_unset():
    assert collective_env("10.213.4.3", {"GLOO_SOCKET_IFNAME": ""}, HOST)["GLOO_SOCKET_IFNAME"] == "ib0"


def test_nothing_is_set_when_no_interface_carries_the_node_ip():
    assert collective_env("10.9.9.9", {}, HOST) == {}
    assert collective_env("not-an-ip", {}, HOST) == {}


def test_the_first_interface_carrying_the_ip_wins():
    twice = {"bond0": ["10.1.1.1"], "eth3": ["10.1.1.1"]}
    assert interface_for("10.1.1.1", twice) == "bond0"


def test_on_this_machine_loopback_is_found_and_a_missing_ip_is_logged(caplog):
    assert socket_ifname_env("127.0.0.1", {}) == {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "=lo"}
    with caplog.at_level(logging.DEBUG, logger="gpusession.cluster.netif"):
        assert socket_ifname_env("203.0.113.77", {}) == {}
    assert "No network interface on this host carries its Ray node IP 203.0.113.77" in caplog.text
