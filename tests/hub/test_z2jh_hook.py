"""The shipped z2jh values (cluster/jupyterhub-values.yaml) sign users as `gpusession hub` does:
their `hub.extraConfig` code runs in a real JupyterHub's Python (the hub's venv from `scripts/setup
--hub`), installs its hook on a real `LocalProcessSpawner` of a real `User` (built on JupyterHub's
own ORM, as JupyterHub's tests build one), and the environment that spawner gives the user's
server carries an identity the broker's check accepts."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from gpusession.hub.plan import DEFAULT_PREFIX
from gpusession.identity import SIGNATURE_ENV, USER_ENV, Identity, verify

from ..conftest import ROOT

HUB_PYTHON = Path(os.environ.get("GPUSESSION_HUB_PREFIX", DEFAULT_PREFIX)) / "venv" / "bin" / "python"
SECRETS_DIR = "/etc/gpusession"  # where the values mount the Kubernetes secret

# Run by the hub's own Python: the values' hook code on JupyterHub's spawner, then the spawner's env.
SPAWN = """
import json, sys
from traitlets.config import Config
from jupyterhub import orm
from jupyterhub.objects import Hub
from jupyterhub.spawner import LocalProcessSpawner, Spawner
from jupyterhub.user import User

hook_code, name = sys.argv[1], sys.argv[2]
c = Config()
exec(compile(hook_code, "jupyterhub-values.yaml:hub.extraConfig.gpusession", "exec"), {"c": c})
db = orm.new_session_factory("sqlite:///:memory:")()
orm_user = orm.User(name=name)
db.add(orm_user)
db.commit()
spawner = LocalProcessSpawner(user=User(orm_user, {}), hub=Hub(), config=c)
spawner.run_pre_spawn_hook()
# the base Spawner's env (what z2jh's KubeSpawner starts from); LocalProcessSpawner's own adds the
# Unix account's HOME and SHELL, which the test's made-up names do not have
print(json.dumps(Spawner.get_env(spawner)))
"""


def values_hook_code(secrets_dir: Path) -> str:
    values = yaml.safe_load((ROOT / "cluster" / "jupyterhub-values.yaml").read_text())
    return values["hub"]["extraConfig"]["gpusession"].replace(SECRETS_DIR, str(secrets_dir))


def spawn_env(secrets_dir: Path, name: str) -> dict[str, str]:
    ran = subprocess.run([str(HUB_PYTHON), "-c", SPAWN, values_hook_code(secrets_dir), name],
                         capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert ran.returncode == 0, ran.stderr[-3000:]
    return json.loads(ran.stdout.strip().splitlines()[-1])


@pytest.fixture
def mounted_secret(tmp_path: Path) -> Path:
    if not HUB_PYTHON.exists():
        pytest.skip(f"{HUB_PYTHON} is missing: run `scripts/setup --hub` first")
    (tmp_path / "identity_key").write_text("the-key-of-the-test\n")
    (tmp_path / "admin_token").write_text("the-admin-token-of-the-test\n")
    return tmp_path


def test_the_z2jh_hook_signs_a_real_spawner_so_the_broker_accepts_that_user_only(mounted_secret):
    env = spawn_env(mounted_secret, "bob")
    key = b"the-key-of-the-test"
    assert env[USER_ENV] == "bob" and env["JUPYTERHUB_USER"] == "bob"
    assert verify(Identity("bob", env[SIGNATURE_ENV]), key)
    assert not verify(Identity("alice", env[SIGNATURE_ENV]), key)  # bob's signature does not make him alice
    assert "GPUSESSION_ADMIN_TOKEN" not in env  # bob is no admin in the values


def test_the_z2jh_hook_gives_the_admin_token_to_the_values_admins_only(mounted_secret):
    env = spawn_env(mounted_secret, "alice")  # GPUSESSION_ADMINS = {"alice"} in the values
    assert env["GPUSESSION_ADMIN_TOKEN"] == "the-admin-token-of-the-test"
    assert verify(Identity("alice", env[SIGNATURE_ENV]), b"the-key-of-the-test")
