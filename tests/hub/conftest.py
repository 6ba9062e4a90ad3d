"""A `gpusession hub` for a module's tests, on loopback, with three Unix accounts made for it (an
admin and two users) and its own service account; everything is removed on every path. Modules
with the same HUB_ARGS share one while they run one after another (`hub`).
Needs root (useradd, and the Hub spawns servers as other users) and `scripts/setup --hub`."""
from __future__ import annotations

import itertools
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import psutil
import pytest

from gpusession.hub.plan import DEFAULT_PREFIX, HubLayout
from gpusession.run import bulk

from ..accounts import add_account, remove_accounts, uid_of
from ..conftest import ROOT
from ..ports import free_port as _free_port  # the name benchmarks/hub.py imports
from ..session_order import items_after_module, takes
from .client import HubUser

PREFIX = Path(os.environ.get("GPUSESSION_HUB_PREFIX", DEFAULT_PREFIX))
READY_TIMEOUT_S = 600.0


@dataclass
class Hub:
    url: str
    proc: subprocess.Popen
    layout: HubLayout
    output: Path
    admin: HubUser
    alice: HubUser
    bob: HubUser

    @property
    def accounts(self) -> list[str]:
        return [self.admin.name, self.alice.name, self.bob.name, self.layout.service_user]

    def processes(self) -> list[psutil.Process]:
        """Every process the hub's accounts run (users' servers and kernels, Ray, the broker).
        A zombie is left out: it has exited, and its parent (or init, for an orphan) reaps it
        moments later (seen in CI: two exited kernels listed as zombies just after the stop)."""
        uids = {uid_of(name) for name in self.accounts} - {None}
        return [p for p in psutil.process_iter(["uids", "status"])
                if p.info["uids"] and p.info["uids"].real in uids and p.info["status"] != psutil.STATUS_ZOMBIE]

    def descendants(self) -> list[psutil.Process]:
        """Every process `gpusession hub` started that is running now (by pid and start time)."""
        return psutil.Process(self.proc.pid).children(recursive=True)


def logged_at(line: str) -> float:
    """The epoch time of a log line written with logging's default asctime (local time, ms)."""
    stamp = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
    return stamp.timestamp()


def needs_root_and_setup() -> str | None:
    if os.geteuid() != 0:
        return "the hub tests make Unix accounts and the Hub spawns servers as them: run them as root"
    for path in HubLayout(PREFIX, Path("/"), "x").missing():
        if not Path(path).exists():
            return f"{path} is missing: run `scripts/setup --hub` first"
    return None


def installed_matches_checkout(layout: HubLayout) -> str | None:
    """The hub runs the gpusession that `scripts/setup --hub` installed (not editable: every
    account must read it), so after a change here the tests would run the old code. None when
    the installed package's sources are this checkout's; else what to do."""
    found = subprocess.run([str(layout.python), "-c", "import gpusession, os; print(os.path.dirname(gpusession.__file__))"],
                           capture_output=True, text=True, cwd="/")
    installed = Path(found.stdout.strip())
    ours = ROOT / "gpusession"
    differ = [str(path.relative_to(ours)) for path in sorted(ours.rglob("*.py"))
              if not (installed / path.relative_to(ours)).is_file()
              or (installed / path.relative_to(ours)).read_bytes() != path.read_bytes()]
    if found.returncode != 0 or differ:
        return (f"the hub's environment ({layout.prefix}) holds another gpusession than this checkout "
                f"({', '.join(differ[:3]) or found.stderr[-300:]} differ): run `scripts/setup --hub` again")
    return None


def _add_account(name: str) -> str:
    password = secrets.token_urlsafe(12)
    add_account(name, system=False)
    subprocess.run(["chpasswd"], input=f"{name}:{password}", text=True, check=True, capture_output=True)
    return password


def wait_for_line(path: Path, text: str, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if text in path.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            raise RuntimeError(f"gpusession hub exited ({proc.returncode}):\n{path.read_text()[-3000:]}")
        time.sleep(0.5)
    raise TimeoutError(f"gpusession hub did not say {text!r} in {timeout_s:.0f} s:\n{path.read_text()[-3000:]}")


def stop_hub(hub_proc: subprocess.Popen, timeout_s: float = 120.0) -> None:
    if hub_proc.poll() is None:
        hub_proc.send_signal(signal.SIGINT)  # as Ctrl-C in its terminal
        try:
            hub_proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            hub_proc.kill()
            hub_proc.wait()


def _remove_everything(prefix: str, names: list[str], state: Path, layout: HubLayout) -> None:
    """Processes of the test accounts (by pid), the accounts with their homes, the directories
    (the service's node folder in /dev/shm too: the hub keeps it while its account exists)."""
    service = uid_of(layout.service_user)
    remove_accounts(names)
    shutil.rmtree(state, ignore_errors=True)
    shutil.rmtree(layout.ray_tmp, ignore_errors=True)
    if service is not None and bulk.NODE_ROOT:
        shutil.rmtree(os.path.join(bulk.NODE_ROOT, f"gpusession-{service}"), ignore_errors=True)


@dataclass
class _Made:
    """A started hub and what its fixture made for it (removed by `close`, on every path)."""
    hub: Hub | None
    proc: subprocess.Popen | None
    prefix: str
    names: list[str]
    state: Path
    layout: HubLayout

    def close(self) -> None:
        if self.proc is not None:
            stop_hub(self.proc)
        _remove_everything(self.prefix, self.names, self.state, self.layout)


_STARTS = itertools.count()  # two hubs of one session (other options) never share account names


def _start(args: tuple[str, ...]) -> _Made:
    """A hub with these extra `gpusession hub` options, up and answering; on failure everything
    made for it is removed before the error goes on."""
    prefix = f"gsh{os.getpid() % 100000}{next(_STARTS)}"
    names = [f"{prefix}a", f"{prefix}b", f"{prefix}c", f"{prefix}s"]
    state = Path(tempfile.mkdtemp(prefix=f"{prefix}-", dir="/tmp"))
    os.chmod(state, 0o755)
    made = _Made(None, None, prefix, names, state, HubLayout(PREFIX, state / "state", names[3]))
    try:
        passwords = [_add_account(name) for name in names[:3]]
        port = _free_port()
        config = state / "hub.json"  # no borrowing: a user over quota waits (the quota test shows it)
        config.write_text('{"allow_borrowing": false}')
        output = state / "hub-output.txt"
        with open(output, "w") as out:
            made.proc = subprocess.Popen(
                [sys.executable, "-m", "gpusession.cli", "hub", "--ip", "127.0.0.1", "--port", str(port),
                 "--admin", names[0], "--config", str(config), "--prefix", str(PREFIX),
                 "--state-dir", str(made.layout.state), "--service-user", made.layout.service_user, *args],
                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        wait_for_line(output, "gpusession hub: ready:", made.proc, READY_TIMEOUT_S)
        url = f"http://127.0.0.1:{port}"
        made.hub = Hub(url, made.proc, made.layout, output,
                       *(HubUser(url, name, password) for name, password in zip(names, passwords)))
        return made
    except BaseException:
        made.close()
        raise


def _hub_args(module) -> tuple[str, ...]:
    return tuple(getattr(module, "HUB_ARGS", ()))


def _wanted_next(request, args: tuple[str, ...]) -> bool:
    """Whether the next module that takes a hub, after this module's last test in this session's
    order (random or not), wants one with the same options. Only then is this one kept: never two
    hubs at once (a 2-core machine), and none left idle while other modules run to the end."""
    following = next((item for item in items_after_module(request) if takes(item, "hub")), None)
    return following is not None and _hub_args(following.module) == args


@pytest.fixture(scope="session")
def _hubs():
    """The session's running hubs by their options; whatever is left is stopped and removed at the
    session's end (after a failure with -x or an interrupt, when no later module stopped it)."""
    running: dict[tuple[str, ...], _Made] = {}
    try:
        yield running
    finally:
        for made in running.values():
            made.close()


@pytest.fixture(scope="module")
def hub(request, _hubs):
    """A module may set HUB_ARGS (a list of `gpusession hub` options) for its hub. Modules with the
    same options share one (a hub's start and stop take minutes): it is kept when the next module
    to take a hub in this session wants the same options, else stopped and removed with the
    module. A module that stops its hub (test_hub_stop) leaves the next one to start a fresh one.
    The state a module leaves in a shared hub is what its tests leave: each test sets up what it
    needs (`_ready`), and compares before and after rather than assume an empty ledger."""
    reason = needs_root_and_setup()
    if reason:
        pytest.skip(reason)
    stale = installed_matches_checkout(HubLayout(PREFIX, Path("/"), "x"))
    if stale:
        pytest.fail(stale)
    args = _hub_args(request.module)
    made = _hubs.get(args)
    if made is not None and made.proc.poll() is not None:  # an earlier module stopped it
        _hubs.pop(args).close()
        made = None
    if made is None:
        made = _hubs[args] = _start(args)
    try:
        yield made.hub
    finally:
        if made.proc.poll() is not None or not _wanted_next(request, args):
            _hubs.pop(args, None)
            made.close()


@pytest.fixture(scope="module")
def browser():
    """Debian's chromium, as tests/e2e drives it (module-scoped for the same reason)."""
    from playwright.sync_api import sync_playwright

    from ..e2e.conftest import CHROMIUM, CHROMIUM_ARGS

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()
