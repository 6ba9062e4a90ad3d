"""The gateway host that test_gateway_runs, test_gateway_lease and test_detach run their kernels
against, as the hub's service runs it (issue 28): one process, a Ray driver of the session's
cluster, that never unpickles what a kernel sent, holding at most CALL_BYTES of one account's calls. Modules that take it share one while they run
one after another (`gateway`)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass

import pytest

from ..conftest import ROOT
from ..session_order import items_after_module

CALL_BYTES = 256 * 2**20  # what one account's calls may hold of the host at a time (the hub's --call-bytes-per-user)

HOST = """
import os, sys
from functools import partial
from gpusession.broker.storage import secrets
from gpusession.cluster import raycluster
from gpusession.gateway.acting import ServiceKeys
from gpusession.gateway.hosted import serve_run
from gpusession.gateway.intake import CallBytes
from gpusession.gateway.server import GatewayServer

db = os.environ["GS_TEST_DB"]
keys = ServiceKeys(secrets.identity_key(db), secrets.admin_token(db))
raycluster.ensure_connected()
calls = CallBytes(int(sys.argv[2]))
server = GatewayServer(sys.argv[1], {"run": partial(serve_run, keys=keys, call_bytes=calls)},
                       admins=frozenset(sys.argv[3:])).start()
print("READY", flush=True)
sys.stdin.read()  # until the test closes stdin
server.stop()
"""


@dataclass
class _Host:
    """A started gateway host: its process and the folder that holds its socket."""
    proc: subprocess.Popen
    folder: str

    @property
    def path(self) -> str:
        return os.path.join(self.folder, "run.sock")

    def close(self) -> None:
        if self.proc.stdin and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


def _start(cluster, admins: tuple[str, ...] = ()) -> _Host:
    """A gateway host as the hub's service runs it; `admins`: the accounts it takes for admins
    (the hub's `--admin`; none for the shared one)."""
    # a folder other accounts may pass through (pytest's own tmp folder is root's alone)
    folder = tempfile.mkdtemp(prefix="gs-gateway-runs-")
    os.chmod(folder, 0o711)
    host = _Host(subprocess.Popen([sys.executable, "-c", HOST, os.path.join(folder, "run.sock"), str(CALL_BYTES),
                                   *admins],
                                  env=cluster.env(GS_TEST_DB=str(cluster.db_path)), stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=str(ROOT)),
                 folder)
    line = host.proc.stdout.readline()
    if not line.startswith("READY"):
        host.proc.kill()
        output = host.proc.stdout.read()
        host.close()
        pytest.fail(f"the gateway host did not start: {line}{output}")
    return host


def _takes_this_gateway(item) -> bool:
    """Whether a test uses this file's `gateway` (test_gateway_broker has one of its own by that
    name; test_detach asks for it by name in its "hub" hosting)."""
    if item.module.__name__.endswith(".test_detach"):
        return True
    defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {}).get("gateway", ())
    return bool(defs) and getattr(defs[-1].func, "__module__", None) == __name__


def _wanted_next(request) -> bool:
    """Whether another module takes the gateway after this module's last test in this session's
    order (random or not): only then is the host kept (idle while modules between them run, as
    the hub's service keeps it), so none is left running while the session's last modules run."""
    return any(_takes_this_gateway(item) for item in items_after_module(request))


@pytest.fixture(scope="session")
def _gateway_hosts(cluster):
    """The running gateway host, if any; stopped at the session's end when no module stopped it
    (after a failure with -x or an interrupt). Torn down before the session's cluster."""
    running: list[_Host] = []
    try:
        yield running
    finally:
        while running:
            running.pop().close()


@pytest.fixture(scope="module")
def gateway(request, cluster, _gateway_hosts):
    """The gateway host's socket. Kept for the next module when that one takes it too, else
    stopped with the module (its socket folder removed)."""
    if _gateway_hosts and _gateway_hosts[0].proc.poll() is not None:  # it died: start another
        _gateway_hosts.pop().close()
    if not _gateway_hosts:
        _gateway_hosts.append(_start(cluster))
    host = _gateway_hosts[0]
    try:
        yield host.path
    finally:
        if host.proc.poll() is not None or not _wanted_next(request):
            _gateway_hosts.remove(host)
            host.close()
