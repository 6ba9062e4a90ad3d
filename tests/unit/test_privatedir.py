"""A directory of this account's own in a folder every account may write (run/privatedir.py):
made 0700, found and used when it is this account's and private, refused (and left as it is) when
another account made it first, when it is a symbolic link, or when others may enter it. Real
folders in a sticky 1777 folder like /dev/shm; another account is `nobody`, for real (root only)."""
from __future__ import annotations

import os
import stat
import subprocess

import pytest

from gpusession.errors import GPUSessionError
from gpusession.run.privatedir import NotPrivate, private_dir

NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: another account makes the folder first")


@pytest.fixture
def shared(tmp_path):
    """A folder like /dev/shm: every account may write it, sticky."""
    folder = tmp_path / "shm"
    folder.mkdir()
    os.chmod(folder, 0o1777)
    return folder


def test_a_missing_directory_is_made_this_accounts_and_mode_0700(shared):
    path = private_dir(str(shared), "gpusession-1")
    found = os.lstat(path)
    assert path == str(shared / "gpusession-1")
    assert stat.S_ISDIR(found.st_mode) and found.st_uid == os.geteuid() and stat.S_IMODE(found.st_mode) == 0o700


def test_a_directory_found_that_is_this_accounts_and_private_is_used_as_it_is(shared):
    (shared / "gpusession-1").mkdir(mode=0o700)
    (shared / "gpusession-1" / "kept").write_text("x")
    assert private_dir(str(shared), "gpusession-1") == str(shared / "gpusession-1")
    assert (shared / "gpusession-1" / "kept").read_text() == "x"


@as_root
def test_a_directory_another_account_made_first_is_refused_naming_its_owner_and_what_to_do(shared):
    taken = shared / "gpusession-1"
    # (from inside the folder: nobody may not pass through the test's own 0700 folders above it)
    subprocess.run(["mkdir", "-m", "0777", taken.name], cwd=taken.parent, user=NOBODY, check=True)
    with pytest.raises(NotPrivate) as refused:
        private_dir(str(shared), "gpusession-1", holds="node files")
    message = str(refused.value)
    assert f"another account made {taken} (owner nobody (uid {NOBODY}), mode 0777)" in message, message
    assert "node files" in message and "an admin removes it" in message, message
    assert isinstance(refused.value, GPUSessionError) and isinstance(refused.value, PermissionError)
    found = os.lstat(taken)
    assert found.st_uid == NOBODY and stat.S_IMODE(found.st_mode) == 0o777, "the refusal changed what it found"


def test_a_symbolic_link_in_its_place_is_refused_and_its_target_left_untouched(shared, tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o755)
    (shared / "gpusession-1").symlink_to(target)
    with pytest.raises(NotPrivate, match=f"{shared / 'gpusession-1'} is a symbolic link \\(to {target}\\)"):
        private_dir(str(shared), "gpusession-1")
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o755 and os.listdir(target) == []


def test_a_directory_of_this_account_that_others_may_enter_is_refused_and_not_changed(shared):
    (shared / "gpusession-1").mkdir()
    os.chmod(shared / "gpusession-1", 0o755)
    with pytest.raises(NotPrivate, match="mode 0755: other accounts may enter it"):
        private_dir(str(shared), "gpusession-1")
    assert stat.S_IMODE(os.stat(shared / "gpusession-1").st_mode) == 0o755


def test_a_file_in_its_place_is_refused(shared):
    (shared / "gpusession-1").write_text("")
    with pytest.raises(NotPrivate, match="is not a directory"):
        private_dir(str(shared), "gpusession-1")


def test_a_folder_others_may_write_that_is_not_sticky_is_refused_as_its_parent(tmp_path):
    """There another account could rename the checked directory aside and put its own in place."""
    loose = tmp_path / "loose"
    loose.mkdir()
    os.chmod(loose, 0o777)
    with pytest.raises(NotPrivate, match="lets another account rename or replace"):
        private_dir(str(loose), "gpusession-1")
    assert os.listdir(loose) == []
