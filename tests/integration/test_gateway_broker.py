"""The gateway's broker session against the session's real cluster and broker, without the hub:
callers are real other accounts (a subprocess that drops to `nobody`, or to `daemon`, which the
gateway's configuration names admin), so the name the broker sees is the one SO_PEERCRED gives."""
from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from gpusession.gateway import process as gatewayproc
from gpusession.gateway.main import load_keys, sessions_for
from gpusession.gateway.server import GatewayServer

from ..conftest import ROOT

USER, ADMIN = "nobody", "daemon"  # accounts every Debian machine has; neither is root
# The callers run Debian's python with this checkout on their path and nothing else: the test
# venv's interpreter lies under /root, and the caller's side needs only the standard library.
CALLER_PYTHON = "/usr/bin/python3"
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="dropping to other accounts needs root (CI runs as root)")


@pytest.fixture
def gateway(cluster):
    folder = Path(tempfile.mkdtemp(prefix="gsgw-", dir="/tmp"))
    os.chmod(folder, 0o755)  # every account may reach the socket, as under the hub
    path, server = folder / "gateway.sock", None
    try:
        server = GatewayServer(path, sessions_for(load_keys(str(cluster.db_path))), admins=frozenset({ADMIN})).start()
        yield path
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(folder)


def as_account(name: str, code: str, path: Path) -> dict:
    """Run `code` as account `name` (uid, gid, no other groups); what it prints, as JSON."""
    if not os.access(CALLER_PYTHON, os.X_OK):
        pytest.skip(f"{CALLER_PYTHON} is missing (the callers run it as other accounts)")
    account = pwd.getpwnam(name)
    prelude = ("import json, sys\nfrom gpusession.gateway import brokerclient\n"
               f"PATH = {str(path)!r}\n"
               "def attempt(method, **args):\n"
               "    try:\n"
               "        return {'result': brokerclient.call(method, path=PATH, **args)}\n"
               "    except Exception as exc:\n"
               "        return {'error': type(exc).__name__, 'message': str(exc)}\n")
    done = subprocess.run([CALLER_PYTHON, "-B", "-c", prelude + code], capture_output=True, text=True, timeout=60,
                          user=account.pw_uid, group=account.pw_gid, extra_groups=[], cwd="/",
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": "/"})
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_broker_answers_the_account_the_socket_names_and_the_caller_imports_no_ray(gateway, broker, admin):
    seen = as_account(USER, "print(json.dumps({'whoami': attempt('whoami'), 'status': attempt('status'),"
                            " 'ray': 'ray' in sys.modules}))", gateway)
    assert seen["whoami"] == {"result": {"user": USER, "admin": False}}
    assert seen["status"]["result"]["user"] == USER
    assert seen["ray"] is False


def test_only_the_configured_admin_changes_quotas_and_forged_credentials_are_refused(gateway, broker, admin):
    from gpusession.broker import client

    before = client.call(broker.quota, USER, admin)
    tried = as_account(USER, "print(json.dumps({"
                             "'set': attempt('set_quota', user='nobody', update={'max_gpus': 99}),"
                             "'reset': attempt('reset_quota', user='daemon'),"
                             "'forged': attempt('quotas', token='guess', user='daemon'),"
                             "'key': attempt('signing_key')}))", gateway)
    assert tried["set"]["error"] == "NotAuthorized"
    assert tried["reset"]["error"] == "NotAuthorized"
    assert tried["forged"]["error"] == "InvalidRequest" and "takes no credentials" in tried["forged"]["message"]
    assert tried["key"]["error"] == "InvalidRequest" and "signing_key" in tried["key"]["message"]
    assert client.call(broker.quota, USER, admin) == before
    try:
        done = as_account(ADMIN, "print(json.dumps(attempt('set_quota', user='nobody', update={'max_gpus': 1})))",
                          gateway)
        assert done["result"]["max_gpus"] == 1
        assert client.call(broker.quota, USER, admin)["max_gpus"] == 1
    finally:
        client.call(broker.reset_quota, USER, admin)


def test_malformed_frames_and_unknown_sessions_are_refused_and_change_nothing(gateway, broker, admin):
    from gpusession.broker import client

    before = client.call(broker.quotas, admin)
    code = """
import socket, struct
def exchange(raw):
    s = socket.socket(socket.AF_UNIX); s.settimeout(20); s.connect(PATH); s.sendall(raw); s.shutdown(socket.SHUT_WR)
    got = b''
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk: break
            got += chunk
    except OSError as exc:
        got += repr(exc).encode()
    s.close(); return got.decode(errors='replace')
def frame(obj): data = json.dumps(obj).encode(); return struct.pack('>Q', len(data)) + data
print(json.dumps({
  'not_json': exchange(struct.pack('>Q', 5) + b'{oops'),
  'huge': exchange(struct.pack('>Q', 1 << 62)),
  'unknown_session': exchange(frame({'kind': 'hello', 'version': 1, 'session': 'admin', 'payload': 0})),
  'bad_call': exchange(frame({'kind': 'hello', 'version': 1, 'session': 'broker', 'payload': 0})
                       + frame({'kind': 'call', 'id': 1, 'method': 'set_quota', 'args': {'user': 'nobody',
                                'update': {'max_gpus': 50}, 'auth': {'token': 'x'}}, 'payload': 0})),
}))
"""
    seen = as_account(USER, code, gateway)
    assert '"refused"' in seen["not_json"] and "not JSON" in seen["not_json"]  # a bad hello: told why, closed
    assert '"refused"' in seen["huge"] and "over the 4096-byte limit" in seen["huge"]
    assert "unknown session 'admin'" in seen["unknown_session"] and '"refused"' in seen["unknown_session"]
    assert '"welcome"' in seen["bad_call"] and "takes no credentials" in seen["bad_call"]
    assert client.call(broker.quotas, admin) == before


def test_the_gateway_process_serves_as_a_ray_driver_and_removes_its_socket_when_stopped(cluster):
    folder = Path(tempfile.mkdtemp(prefix="gsgw-", dir="/tmp"))
    path, proc = folder / "gateway.sock", None
    try:
        proc = gatewayproc.start(env=cluster.env(), socket=str(path), db_path=str(cluster.db_path), admins=[ADMIN],
                                 timeout_s=180)
        from gpusession.gateway import brokerclient

        assert brokerclient.call("whoami", path=str(path)) == {"user": "root", "admin": False}
        assert brokerclient.call("cluster", path=str(path))["gpus_total"] > 0
        assert "db_path" not in brokerclient.call("info", path=str(path))
        gatewayproc.stop(proc)
        assert not path.exists()  # it removes its socket as it stops
    finally:
        if proc is not None:
            gatewayproc.stop(proc)
        shutil.rmtree(folder)
