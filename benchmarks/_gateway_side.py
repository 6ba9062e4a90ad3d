"""The gateway's side of benchmarks/call_overhead.py: a gateway host joined to the benchmark's
cluster (as the hub's gateway process is to the service's), and a kernel-like process that
reaches it only through GPUSESSION_GATEWAY (no Ray address, no Ray imported) and makes a call
each time it is told to, so that its calls alternate with the direct ones, timed inside the
caller exactly as those are."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_HOST = """
import sys
from functools import partial
from gpusession.broker.storage import secrets
from gpusession.cluster import raycluster
from gpusession.gateway.acting import ServiceKeys
from gpusession.gateway.hosted import serve_run
from gpusession.gateway.server import GatewayServer

db = sys.argv[2]
keys = ServiceKeys(secrets.identity_key(db), secrets.admin_token(db))
raycluster.ensure_connected()
server = GatewayServer(sys.argv[1], {"run": partial(serve_run, keys=keys)}).start()
print("READY", flush=True)
sys.stdin.read()
server.stop()
"""

# A new process's one call, the same through the gateway as directly (call_overhead.py uses it too).
FIRST_CALL = """
import gpusession as gs
from gpusession.observe import events
events.set_observer_factory(lambda world_size: events.Observer())

@gs.distributed(gpus=2)
def allreduce():
    import torch
    import torch.distributed as dist

    value = torch.ones(1)
    dist.all_reduce(value)
    return value.item()

assert allreduce() == 2.0
"""

# A kernel that makes that call each time it reads a line, and prints its seconds.
WARM_LOOP = FIRST_CALL.replace("assert allreduce() == 2.0\n", """import sys, time
print("READY", flush=True)
for line in sys.stdin:
    started = time.perf_counter()
    assert allreduce() == 2.0
    print(f"{time.perf_counter() - started:.6f} {'ray' in sys.modules}", flush=True)
""")


class GatewaySide:
    """start(): the host and a kernel; call(): one warm call's seconds, as the kernel timed it."""

    def __init__(self, gcs_address: str, db_path: str) -> None:
        self.folder = tempfile.mkdtemp(prefix="gs-bench-gateway-")
        self.socket = os.path.join(self.folder, "gateway.sock")
        host_env = dict(os.environ, RAY_ADDRESS=gcs_address)
        self.host = subprocess.Popen([sys.executable, "-c", _HOST, self.socket, db_path], env=host_env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=str(ROOT))
        _expect_ready(self.host, "gateway host")
        self.kernel = subprocess.Popen([sys.executable, "-c", WARM_LOOP], env=self.kernel_env(),
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=str(ROOT))
        _expect_ready(self.kernel, "gateway kernel")

    def kernel_env(self) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        env["GPUSESSION_GATEWAY"] = self.socket
        return env

    def call(self) -> float:
        self.kernel.stdin.write("call\n")
        self.kernel.stdin.flush()
        seconds, ray_imported = self.kernel.stdout.readline().split()
        if ray_imported != "False":
            raise SystemExit("the kernel behind the gateway imported ray")
        return float(seconds)

    def first_call_seconds(self) -> float:
        """A new process that reaches the cluster only through the gateway: interpreter start,
        import, the call; timed from outside as a whole subprocess."""
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", FIRST_CALL], env=self.kernel_env(), capture_output=True, check=True,
                       timeout=300, cwd=str(ROOT))
        return time.perf_counter() - started

    def stop(self) -> None:
        for proc in (self.kernel, self.host):
            proc.stdin.close()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        try:
            os.unlink(self.socket)
        except FileNotFoundError:
            pass
        os.rmdir(self.folder)


def _expect_ready(proc: subprocess.Popen, what: str) -> None:
    line = proc.stdout.readline()
    if line.strip() != "READY":
        proc.kill()
        raise SystemExit(f"the {what} did not start (exit status {proc.poll()}): {line!r}")
