"""What root does to the hub's paths (gpusession/launcher/rootfs.py), on real files: a symlink, a FIFO, a
file or another account's directory where root expected its own is refused, naming the path, and
nothing is changed; secrets are read only from private regular files of the service account."""
from __future__ import annotations

import os
import stat
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpusession.hub import accounts, spawnhook
from gpusession.launcher import rootfs

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="changes file owners: needs root (CI runs as root)")
SERVICE = 1  # `daemon`: an account other than root, present on every Debian machine
STRANGER = 65534  # `nobody`


@pytest.fixture
def parent(tmp_path):
    folder = tmp_path / "state"
    folder.mkdir(mode=0o755)
    os.chmod(folder, 0o755)
    return folder


def owner_and_mode(path: Path) -> tuple[int, int]:
    found = os.lstat(path)
    return found.st_uid, stat.S_IMODE(found.st_mode)


def test_a_missing_directory_is_made_with_the_owner_and_mode_asked_for(parent):
    rootfs.ensure_directory(parent / "cluster", uid=SERVICE, gid=SERVICE, mode=0o700)
    assert owner_and_mode(parent / "cluster") == (SERVICE, 0o700)


def test_a_directory_of_its_own_account_from_an_earlier_start_is_kept_and_its_mode_set_again(parent):
    (parent / "cluster").mkdir(mode=0o777)
    os.chown(parent / "cluster", SERVICE, SERVICE)
    os.chmod(parent / "cluster", 0o777)
    rootfs.ensure_directory(parent / "cluster", uid=SERVICE, gid=SERVICE, mode=0o700)
    assert owner_and_mode(parent / "cluster") == (SERVICE, 0o700)


def test_a_symlink_in_place_of_a_directory_is_refused_and_its_target_keeps_its_owner(parent, tmp_path):
    target = tmp_path / "roots-own"
    target.mkdir(mode=0o755)
    os.chmod(target, 0o755)
    (parent / "tmp").symlink_to(target)
    with pytest.raises(rootfs.UnsafePath, match=r"state/tmp is a symbolic link, not a directory"):
        rootfs.ensure_directory(parent / "tmp", uid=SERVICE, gid=SERVICE, mode=0o700)
    assert owner_and_mode(target) == (0, 0o755)


@pytest.mark.parametrize("make, kind", [(os.mkfifo, "a FIFO"), (lambda p: Path(p).write_text("x"), "a regular file")])
def test_a_fifo_or_a_file_in_place_of_a_directory_is_refused_naming_it(parent, make, kind):
    make(str(parent / "cluster"))
    with pytest.raises(rootfs.UnsafePath, match=f"state/cluster is {kind}, not a directory"):
        rootfs.ensure_directory(parent / "cluster", uid=SERVICE, gid=SERVICE, mode=0o700)


def test_another_accounts_directory_where_the_service_expects_its_own_is_refused_and_unchanged(parent):
    (parent / "ray").mkdir(mode=0o755)
    os.chown(parent / "ray", STRANGER, STRANGER)
    with pytest.raises(rootfs.UnsafePath, match=r"belongs to nobody \(uid 65534\), not to daemon"):
        rootfs.ensure_directory(parent / "ray", uid=SERVICE, gid=SERVICE, mode=0o711)
    assert owner_and_mode(parent / "ray")[0] == STRANGER


def test_a_parent_another_account_may_change_is_refused_unless_it_is_sticky_as_tmp_is(parent):
    os.chmod(parent, 0o777)
    with pytest.raises(rootfs.UnsafePath, match="may be changed by other accounts"):
        rootfs.ensure_directory(parent / "hub", uid=0, gid=0, mode=0o700)
    assert not (parent / "hub").exists()
    os.chmod(parent, 0o1777)
    rootfs.ensure_directory(parent / "hub", uid=0, gid=0, mode=0o700)
    assert owner_and_mode(parent / "hub") == (0, 0o700)


def test_a_parent_of_another_account_is_refused(parent):
    os.chown(parent, STRANGER, STRANGER)
    with pytest.raises(rootfs.UnsafePath, match="not root: whoever owns it could swap"):
        rootfs.ensure_directory(parent / "hub", uid=0, gid=0, mode=0o700)


@pytest.fixture
def secret(parent):
    """A secret as the broker makes it: 0600, of the service account, in its 0700 directory."""
    folder = parent / "cluster"
    folder.mkdir(mode=0o700)
    os.chown(folder, SERVICE, SERVICE)
    path = folder / "identity_key"
    path.write_text("0123abcd\n")
    os.chmod(path, 0o600)
    os.chown(path, SERVICE, SERVICE)
    return path


def test_a_private_secret_of_the_service_account_is_read_stripped(secret):
    assert rootfs.read_secret(secret, owner=SERVICE) == "0123abcd"


def test_a_fifo_in_place_of_a_secret_is_refused_at_once_instead_of_blocking_the_reader(secret):
    secret.unlink()
    os.mkfifo(secret, 0o600)
    os.chown(secret, SERVICE, SERVICE)
    with pytest.raises(rootfs.UnsafePath, match="is a FIFO, not a regular file"):
        rootfs.read_secret(secret, owner=SERVICE)
    with pytest.raises(rootfs.UnsafePath, match="is a FIFO"):  # a Kubernetes-style read refuses it too
        rootfs.read_secret(secret, owner=None)


def test_a_symlink_in_place_of_a_secret_is_not_followed(secret, tmp_path):
    elsewhere = tmp_path / "roots-secret"
    elsewhere.write_text("root's own")
    secret.unlink()
    secret.symlink_to(elsewhere)
    with pytest.raises(rootfs.UnsafePath, match="cannot be opened as a secret .*a symbolic link"):
        rootfs.read_secret(secret, owner=SERVICE)


def test_a_secret_readable_by_others_or_of_another_owner_or_empty_is_refused(secret):
    os.chmod(secret, 0o644)
    with pytest.raises(rootfs.UnsafePath, match="readable by others"):
        rootfs.read_secret(secret, owner=SERVICE)
    os.chmod(secret, 0o600)
    os.chown(secret, STRANGER, STRANGER)
    with pytest.raises(rootfs.UnsafePath, match="not the service's secret"):
        rootfs.read_secret(secret, owner=SERVICE)
    os.chown(secret, SERVICE, SERVICE)
    secret.write_text("")
    with pytest.raises(rootfs.UnsafePath, match="holds 0 bytes"):
        rootfs.read_secret(secret, owner=SERVICE)
    secret.write_text(" \n")
    with pytest.raises(rootfs.UnsafePath, match="only blanks"):
        rootfs.read_secret(secret, owner=SERVICE)


def test_a_kubernetes_secret_volume_is_read_through_its_symlinks(tmp_path):
    data = tmp_path / "..data"
    data.mkdir()
    (data / "identity_key").write_text("k8s-key")
    (tmp_path / "identity_key").symlink_to(data / "identity_key")
    assert rootfs.read_secret(tmp_path / "identity_key", owner=None) == "k8s-key"


def test_the_spawn_hook_refuses_a_fifo_key_with_a_message_instead_of_hanging_the_login(secret):
    token = secret.with_name("admin_token")
    token.write_text("admin")
    os.chmod(token, 0o600)
    os.chown(token, SERVICE, SERVICE)
    spawner = SimpleNamespace(user=SimpleNamespace(name="alice"), environment={})
    hook = spawnhook.pre_spawn_hook(key_path=secret, admin_token_path=token, admins=["alice"], owner="daemon")
    hook(spawner)
    assert spawner.environment[spawnhook.ADMIN_TOKEN_ENV] == "admin"
    secret.unlink()
    os.mkfifo(secret, 0o600)
    os.chown(secret, SERVICE, SERVICE)
    with pytest.raises(rootfs.UnsafePath, match="identity_key is a FIFO"):
        hook(SimpleNamespace(user=SimpleNamespace(name="bob"), environment={}))


@pytest.mark.parametrize("name", ["root", "nobody"])
def test_the_hub_will_not_run_its_cluster_as_root_or_as_a_persons_account(name, tmp_path):
    with pytest.raises(accounts.HubSetupError, match="not a system account"):
        accounts.ensure_service_user(name, tmp_path)


def test_rays_token_is_new_at_every_start():
    assert accounts.ray_token() != accounts.ray_token()
