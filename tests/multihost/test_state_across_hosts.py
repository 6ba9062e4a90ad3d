"""Two Ray clusters whose heads are two hosts sharing one home directory (NFS, say): each broker
keeps its own ledger, admin token and identity key, in a directory of its own cluster's head."""
from __future__ import annotations

import json

import pytest

from .conftest import HERE

pytestmark = pytest.mark.timeout(600)


def state_of(cluster, head, **env: str) -> dict:
    status, out = cluster.run_python(head, str(HERE / "state_script.py"), timeout=240, **env)
    lines = [line for line in out.splitlines() if line.startswith("STATE ")]
    assert status == 0 and lines, f"state_script.py on {head.name} failed (exit status {status}):\n{out[-4000:]}"
    return json.loads(lines[-1][len("STATE "):])


@pytest.fixture(scope="module")
def second_cluster(sim_cluster):
    """Another cluster's head, on a host of its own whose HOME is the first head's."""
    other = sim_cluster.add_host("head2", head=True, home_of=sim_cluster.head)
    yield other
    sim_cluster.remove_host(other)


def test_two_clusters_whose_heads_share_a_home_never_share_a_ledger_token_or_key(sim_cluster, second_cluster):
    first = state_of(sim_cluster, sim_cluster.head)
    second = state_of(sim_cluster, second_cluster, RAY_ADDRESS=f"{second_cluster.ip}:6379")
    home = sim_cluster.head.home.resolve()
    assert (first["host"], second["host"]) == ("head", "head2")
    assert first["ledger"] == str(home / ".gpusession" / "clusters" / "head" / "ledger.db")
    assert second["ledger"] == str(home / ".gpusession" / "clusters" / "head2" / "ledger.db")
    assert first["ledger_id"] != second["ledger_id"]
    assert first["admin_token"] != second["admin_token"]
    assert first["identity_key"] != second["identity_key"]
