"""Unix accounts a test makes (root only, names with the test's unique prefix), and their removal
on every path: the accounts' processes by pid, then the accounts with their homes and groups."""
from __future__ import annotations

import pwd
import subprocess

import psutil


def add_account(name: str, *, system: bool, shell: str = "/bin/bash") -> pwd.struct_passwd:
    """A system account (a service's: no home) or a user's (with a home), each in its own group."""
    flags = ["--system", "--no-create-home"] if system else ["--create-home"]
    subprocess.run(["useradd", *flags, "--user-group", "--shell", shell, name], check=True, capture_output=True)
    return pwd.getpwnam(name)


def uid_of(name: str) -> int | None:
    try:
        return pwd.getpwnam(name).pw_uid
    except KeyError:
        return None


def kill_processes_of(names: list[str]) -> None:
    """SIGKILL, by pid, every process whose real uid is one of these accounts'."""
    uids = {uid_of(name) for name in names} - {None}
    for proc in psutil.process_iter(["uids"]):
        if proc.info["uids"] and proc.info["uids"].real in uids:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass


def remove_accounts(names: list[str]) -> None:
    """These accounts' processes, then the accounts with their homes and their own groups."""
    kill_processes_of(names)
    for name in names:
        if uid_of(name) is not None:
            subprocess.run(["userdel", "--remove", "--force", name], capture_output=True)
        subprocess.run(["groupdel", name], capture_output=True)
