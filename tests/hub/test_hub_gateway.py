"""`gpusession hub` behind its gateway, attacked from bob's side (issue 28): bob's server, kernels
and terminals hold no Ray address or token and none of the service's secrets, cannot join Ray,
cannot read the service's files, cannot use admin methods through the gateway (the admin can),
and garbage or unknown sessions at the gateway's socket change nothing. What users need still
answers through the gateway: status, `%gpu status`, the REST API the Lab sidebar and the admin
page use, the `gpusession` CLI. That stopping the hub ends the gateway and removes its socket is
test_hub_stop's (it stops the hub this module shares with test_hub)."""
from __future__ import annotations

import json
import re

import psutil
import pytest

from .test_hub import HUB_ARGS, _ready  # noqa: F401 (HUB_ARGS: test_hub's hub, shared)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SECRET_NAMES = ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "GPUSESSION_ADMIN_TOKEN")

READ_PROC = """import os, json
seen = {'own': dict(os.environ)}
for pid in os.listdir('/proc'):
    if pid.isdigit():
        for part in ('environ', 'cmdline'):
            try:
                with open(f'/proc/{pid}/{part}', 'rb') as f:
                    seen[f'{pid}/{part}'] = f.read().decode(errors='replace')
            except OSError:
                pass
print(json.dumps(seen))"""


def _json(ran) -> object:
    assert ran.error is None, ran
    return json.loads(ran.stdout.strip().splitlines()[-1])


def _service(hub) -> psutil.Process:
    found = [p for p in hub.descendants() if "gpusession.hub.service" in " ".join(p.cmdline())]
    assert found, "the hub's cluster service is not running"
    return found[0]


def _secrets(hub) -> dict[str, str]:
    """The values bob must never see (read here as root)."""
    ray_token = _service(hub).environ()["RAY_AUTH_TOKEN"]
    return {"admin token": hub.layout.admin_token_path.read_text().strip(),
            "identity key": hub.layout.identity_key_path.read_text().strip(), "Ray token": ray_token}


def _ray_address(hub) -> str:
    return re.search(r"Ray at (\S+),", hub.output.read_text()).group(1)


def ledger(hub) -> tuple:
    """The quotas and leases as the admin page reads them (through the admin's gateway session)."""
    quotas = hub.admin.api("GET", "gpusession/api/quotas")
    leases = hub.admin.api("GET", "gpusession/api/leases?all=1")
    assert quotas.status_code == 200 and leases.status_code == 200, (quotas.text, leases.text)
    return ([(q["user"], q["max_gpus"], q["gpu_hours"], q["max_priority"], q["updated_at"]) for q in quotas.json()],
            [(l["lease_id"], l["state"]) for l in leases.json()])


def test_bob_finds_no_ray_address_token_or_secret_in_any_environment_or_command_line(hub):
    _ready(hub.admin, hub.bob)
    terminal = hub.bob.api("POST", "api/terminals")  # a terminal of bob's: its shell is read below too
    assert terminal.status_code == 200, terminal.text
    seen = _json(hub.bob.run(READ_PROC))
    shells = [p for p in psutil.process_iter(["username", "name"])
              if p.info["username"] == hub.bob.name and p.info["name"] in ("bash", "sh")]
    assert shells and all(f"{p.pid}/environ" in seen for p in shells), "bob's terminal was not read"
    assert seen["own"].get("GPUSESSION_GATEWAY") == str(hub.layout.gateway_socket)
    assert not [name for name in SECRET_NAMES if name in seen["own"]], seen["own"]
    environs = {where: text for where, text in seen.items() if where.endswith("/environ")}
    assert environs, "bob could read no environment at all (his own server's and kernel's are his)"
    leaked_names = [(where, name) for where, text in environs.items() for name in SECRET_NAMES
                    if f"{name}=" in text]
    assert leaked_names == []
    text = json.dumps(seen)
    for what, value in _secrets(hub).items():
        assert value not in text, f"bob can read the {what} in an environment or a command line"


JOIN_ATTEMPTS = """import json, os, subprocess, sys
def joins(address):
    return ("import ray; print('IMPORTED', flush=True); ray.init(address=" + repr(address) +
            ", logging_level='ERROR'); print('JOINED', flush=True)")
token = {'RAY_AUTH_MODE': 'token'}
guessed = {**token, 'RAY_AUTH_TOKEN': 'f' * 64}
tries = {'plain': (GCS, {}), 'token mode, no token': (GCS, token), 'guessed token': (GCS, guessed),
         'ray client': (CLIENT, {}), 'ray client, guessed token': (CLIENT, guessed)}
# a refused attempt is refused at its first try: each gives up sooner than Ray's defaults would
# (about 20 tries a second apart at the GCS; a Ray Client's three tries 5, 10 and 15 s apart)
sooner = {'RAY_gcs_server_port_wait_time_s': '2', 'RAY_CLIENT_INITIAL_CONNECTION_TIMEOUT_S': '1'}
procs = {name: subprocess.Popen([sys.executable, '-c', joins(where)], env={**os.environ, **sooner, **extra}, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL) for name, (where, extra) in tries.items()}
joined = {}
for name, proc in procs.items():
    try:
        out, _ = proc.communicate(timeout=40)  # a hung attempt has not joined either
    except subprocess.TimeoutExpired:
        proc.kill(); out, _ = proc.communicate()
    joined[name] = 'JOINED' if 'JOINED' in out else 'refused' if 'IMPORTED' in out else 'no ray'
try:
    os.listdir(RAY_TMP); listed = True
except PermissionError:
    listed = False
print(json.dumps({'joined': joined, 'listed_ray_tmp': listed}))"""


def _ray_client_address(hub) -> str:
    """Where the head's Ray Client server listens (ray://...), found as root from its process."""
    for proc in psutil.process_iter(["cmdline", "username"]):
        if proc.info["username"] == hub.layout.service_user and "ray.util.client.server" in " ".join(
                proc.info["cmdline"] or ()):
            ports = [c.laddr.port for c in proc.net_connections("tcp") if c.status == psutil.CONN_LISTEN]
            if ports:
                return f"ray://127.0.0.1:{min(ports)}"
    raise AssertionError("the head's Ray Client server was not found")


def test_bob_cannot_join_ray_at_any_address_or_reach_its_sockets(hub):
    """The GCS address (as a user might learn it) and the Ray Client server, with no token, with
    token mode and no token, with a guessed token: each attempt imports Ray, then is refused."""
    _ready(hub.bob)
    where = f"GCS, CLIENT, RAY_TMP = {_ray_address(hub)!r}, {_ray_client_address(hub)!r}, {str(hub.layout.ray_tmp)!r}\n"
    seen = _json(hub.bob.run(where + JOIN_ATTEMPTS, timeout_s=120))
    assert seen == {"joined": {"plain": "refused", "token mode, no token": "refused", "guessed token": "refused",
                               "ray client": "refused", "ray client, guessed token": "refused"},
                    "listed_ray_tmp": False}


def test_bob_cannot_read_the_services_or_the_hubs_secret_files(hub):
    _ready(hub.bob)
    paths = [hub.layout.admin_token_path, hub.layout.identity_key_path, hub.layout.db_path,
             hub.layout.hub_dir / "jupyterhub_cookie_secret", hub.layout.hub_dir / "jupyterhub.sqlite"]
    code = ("import json\nout = {}\n"
            f"for path in {[str(p) for p in paths]!r}:\n"
            "    try:\n        open(path, 'rb').read(); out[path] = 'read'\n"
            "    except OSError as exc:\n        out[path] = type(exc).__name__\n"
            "print(json.dumps(out))")
    assert set(_json(hub.bob.run(code)).values()) == {"PermissionError"}


def test_admin_methods_through_the_gateway_are_the_admins_alone(hub):
    _ready(hub.admin, hub.bob)
    before = ledger(hub)
    # a lease of another account (the hub may be shared with other modules: lease 1 can be bob's
    # own), or, when there is none yet, an id nobody holds
    leases = hub.admin.api("GET", "gpusession/api/leases?all=1").json()
    theirs = max((l["lease_id"] for l in leases if l["user"] != hub.bob.name), default=10**9)
    code = f"""import json
from gpusession.gateway import brokerclient
out = {{}}
for method, args in [('set_quota', {{'user': {hub.bob.name!r}, 'update': {{'max_gpus': 4}}}}),
                     ('reset_quota', {{'user': {hub.admin.name!r}}}), ('revoke', {{'lease_id': {theirs}}}),
                     ('stats', {{'wait_bounds': [1.0]}}), ('quota', {{'user': {hub.admin.name!r}}})]:
    try:
        brokerclient.call(method, **args); out[method] = 'done'
    except Exception as exc:
        out[method] = type(exc).__name__
print(json.dumps(out))"""
    refused = _json(hub.bob.run(code))
    assert refused["set_quota"] == refused["reset_quota"] == refused["stats"] == refused["quota"] == "NotAuthorized"
    assert refused["revoke"] in ("NotAuthorized", "LeaseNotFound"), refused
    assert hub.bob.api("PUT", f"gpusession/api/quotas/{hub.bob.name}", json={"max_gpus": 4}).status_code == 403
    assert ledger(hub) == before
    assert hub.admin.api("GET", "gpusession/admin").status_code == 200  # the admin page, as before
    assert hub.bob.api("GET", "gpusession/admin").status_code == 403
    assert hub.admin.api("GET", "gpusession/api/whoami").json() == {"user": hub.admin.name, "admin": True}
    assert hub.admin.api("GET", "gpusession/metrics").status_code == 200  # ledger-wide stats: the admin's
    put = hub.admin.api("PUT", f"gpusession/api/quotas/{hub.bob.name}", json={"max_gpus": 3})
    try:
        assert put.status_code == 200, put.text
        assert hub.bob.api("GET", "gpusession/api/status").json()["quota"]["max_gpus"] == 3
    finally:
        assert hub.admin.api("DELETE", f"gpusession/api/quotas/{hub.bob.name}").status_code == 200


def test_garbage_and_unknown_sessions_at_the_gateway_are_refused_and_change_nothing(hub):
    _ready(hub.admin, hub.bob)
    before = ledger(hub)
    code = """import json, os, socket, struct
PATH = os.environ['GPUSESSION_GATEWAY']
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
hello = frame({'kind': 'hello', 'version': 1, 'session': 'broker', 'payload': 0})
print(json.dumps({
  'pickle': exchange(struct.pack('>Q', 9) + b'\\x80\\x04K\\x01.xxxx'),
  'huge': exchange(struct.pack('>Q', 1 << 62)),
  'admin_session': exchange(frame({'kind': 'hello', 'version': 1, 'session': 'admin', 'payload': 0})),
  'forged': exchange(hello + frame({'kind': 'call', 'id': 1, 'method': 'set_quota', 'payload': 0,
                                     'args': {'user': 'x', 'update': {'max_gpus': 9}, 'token': 'guess'}})),
  'key': exchange(hello + frame({'kind': 'call', 'id': 2, 'method': 'signing_key', 'payload': 0})),
}))"""
    seen = _json(hub.bob.run(code))
    assert '"refused"' in seen["pickle"] and "not JSON" in seen["pickle"]  # a bad hello: told why, closed
    assert '"refused"' in seen["huge"] and "over the 4096-byte limit" in seen["huge"]
    assert "unknown session 'admin'" in seen["admin_session"]
    assert "takes no credentials" in seen["forged"] and "no broker method 'signing_key'" in seen["key"]
    assert ledger(hub) == before


def test_status_the_rest_api_and_the_cli_answer_bob_through_the_gateway_and_his_server_loads_no_ray(hub):
    _ready(hub.bob)
    status = hub.bob.api("GET", "gpusession/api/status")
    assert status.status_code == 200 and status.json()["user"] == hub.bob.name
    assert hub.bob.api("GET", "gpusession/api/cluster").json()["gpus_total"] == 4
    shown = hub.bob.run("%gpu status")
    assert shown.error is None and f"{hub.bob.name}: 0 GPUs in use" in shown.stdout, shown
    # gs.status() in a fresh process of bob's (a kernel's environment): answered without importing Ray
    fresh = hub.bob.run("import subprocess, sys\nprint(subprocess.run([sys.executable, '-c', 'import sys, gpusession "
                        "as gs; print(gs.status().user, \"ray\" in sys.modules)'], capture_output=True, text=True, "
                        "timeout=60).stdout)")
    assert fresh.stdout.split() == [hub.bob.name, "False"], fresh
    cli = hub.bob.run("import subprocess\nprint(subprocess.run(['gpusession', 'status'], capture_output=True, "
                      "text=True, timeout=60).stdout)")
    assert f"{hub.bob.name}: 0 GPUs in use" in cli.stdout, cli
    # bob's Jupyter server answered all of that without loading Ray (no _raylet.so in its memory)
    servers = [p for p in psutil.process_iter(["username", "cmdline"]) if p.info["username"] == hub.bob.name
               and any(part.endswith("jupyterhub-singleuser") for part in p.info["cmdline"] or ())]
    assert servers, "bob's server (jupyterhub-singleuser) was not found among his processes"
    for server in servers:
        with open(f"/proc/{server.pid}/maps") as maps:
            assert "_raylet" not in maps.read(), f"bob's server {server.pid} loaded Ray"


HELD_LEASE = """import getpass
def who():
    return getpass.getuser(), gs.context().lease_id
with gs.lease(gpus=1) as held:
    first, second = held.run(who), held.run(who)
    status = gs.status()
print(first[0], first[1] == second[1] == held.lease_id, [l["lease_id"] for l in status.leases] == [held.lease_id],
      held.released)"""


def test_a_held_lease_in_bobs_kernel_runs_as_bob_through_the_gateway_and_starts_no_ray_of_his_own(hub):
    """gs.lease in a hub kernel: the gateway holds the lease for bob (his quota, his ranks), two runs
    use it, the block's end releases it; it never falls back to starting a Ray head as bob."""
    _ready(hub.bob)
    ran = hub.bob.run(HELD_LEASE, timeout_s=240)
    assert ran.error is None, ran
    assert ran.stdout.split()[-4:] == [hub.bob.name, "True", "True", "True"], ran
    leases = hub.bob.api("GET", "gpusession/api/leases")  # his own, as the Lab sidebar reads them
    assert leases.status_code == 200 and [l for l in leases.json() if l["state"] != "ended"] == [], leases.text
    bobs = [p.info["cmdline"] for p in psutil.process_iter(["username", "cmdline"])
            if p.info["username"] == hub.bob.name
            and any(part in " ".join(p.info["cmdline"] or ()) for part in ("raylet", "gcs_server", "ray start"))]
    assert bobs == []
