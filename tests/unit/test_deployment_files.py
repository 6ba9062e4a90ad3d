"""cluster/: the manifests parse, pin the Ray we run, and set only settings the broker reads."""
from __future__ import annotations

from pathlib import Path

import ray
import yaml

from gpusession.broker.service.settings import ENV_PREFIX, POLICY_KEYS

CLUSTER = Path(__file__).resolve().parents[2] / "cluster"


def test_the_kuberay_manifest_pins_this_ray_and_keeps_the_ledger_on_a_volume():
    claim, raycluster = list(yaml.safe_load_all((CLUSTER / "raycluster.yaml").read_text()))
    assert raycluster["kind"] == "RayCluster" and raycluster["spec"]["rayVersion"] == ray.__version__
    head = raycluster["spec"]["headGroupSpec"]["template"]["spec"]
    env = {e["name"]: e["value"] for e in head["containers"][0]["env"]}
    mounts = {m["mountPath"] for m in head["containers"][0]["volumeMounts"]}
    assert env["GPUSESSION_DB_PATH"].startswith(tuple(mounts))
    assert head["volumes"][0]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    known = {ENV_PREFIX + "DB_PATH"} | {ENV_PREFIX + k.upper() for k in POLICY_KEYS}
    assert set(env) <= known  # a typo would silently do nothing


def test_the_jupyterhub_values_point_user_servers_at_the_head_service():
    values = yaml.safe_load((CLUSTER / "jupyterhub-values.yaml").read_text())
    single = values["singleuser"]
    config = single["extraFiles"]["gpusession-server-config"]["data"]["GPUSession"]
    assert config["ray_address"] == single["extraEnv"]["RAY_ADDRESS"]
    assert config["admin_users"]


def test_the_hub_signs_each_user_as_the_broker_verifies_and_gives_only_admins_the_token(tmp_path):
    from types import SimpleNamespace

    from gpusession.identity import Identity, verify

    values = yaml.safe_load((CLUSTER / "jupyterhub-values.yaml").read_text())
    (tmp_path / "identity_key").write_text("k3y\n")
    (tmp_path / "admin_token").write_text("t0ken\n")
    snippet = values["hub"]["extraConfig"]["gpusession"]
    assert snippet.count("/etc/gpusession/") == 2  # the mounted secret's two files, read from here below
    config = SimpleNamespace(Spawner=SimpleNamespace())
    namespace = {"c": config}
    exec(snippet.replace("/etc/gpusession/", f"{tmp_path}/"), namespace)
    environments = {}
    for name in ("alice", "bob"):
        spawner = SimpleNamespace(user=SimpleNamespace(name=name), environment={})
        config.Spawner.pre_spawn_hook(spawner)
        environments[name] = spawner.environment
    for name, env in environments.items():
        assert env["GPUSESSION_USER"] == name
        assert verify(Identity(name, env["GPUSESSION_IDENTITY"]), b"k3y")
    assert environments["alice"]["GPUSESSION_ADMIN_TOKEN"] == "t0ken"  # an admin
    assert "GPUSESSION_ADMIN_TOKEN" not in environments["bob"]  # an ordinary user never sees it
    admins = values["singleuser"]["extraFiles"]["gpusession-server-config"]["data"]["GPUSession"]["admin_users"]
    assert set(admins) == namespace["GPUSESSION_ADMINS"]
