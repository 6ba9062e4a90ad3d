"""What a worker actor does with the root launcher, run by the launcher tests as the service
account: `python launcher_client.py SOCKET ACCOUNT CODE` forks the attempt's store and then one
rank as ACCOUNT, runs CODE's `fn()` in that rank (world size 1, gloo), and prints JSON lines:
{"forked": pid} once the rank runs, then {"value": ...}, {"error": ...} or {"refused": ...}."""
from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
import uuid

import cloudpickle

from gpusession.errors import LaunchRefused
from gpusession.run import bulk, handoff, wire
from gpusession.run import messages as m
from gpusession.run.spec import RankSpec
from gpusession.run.node.zygote import Zygote


def say(message: dict) -> None:
    print(json.dumps(message), flush=True)


def main(path: str, account: str, code: str) -> int:
    launcher = Zygote.connect(path, 30.0)
    launcher.wait_ready(300.0)
    try:
        store_pid, store = launcher.fork(account=account, role="store")
    except LaunchRefused as exc:
        say({"refused": str(exc)})
        return 0
    handoff.send(store.fileno(), None, None)
    store.send(m.ServeStore("127.0.0.1", 1, 60.0))
    served = wire.decode(store.recv_bytes(), store.recv_bytes)
    assert not served.error, served.error
    namespace: dict = {}
    exec(code, namespace)
    spec = RankSpec(rank=0, world_size=1, local_rank=0, local_world_size=1, node_rank=0, master_addr="127.0.0.1",
                    master_port=served.port, backend="gloo", node_gpu_ids=(), gpu_ids=(), lease_id=1,
                    logical_gpus=True, return_value=True, caller_host=socket.gethostname(),
                    caller_cwd=os.environ.get("CALLER_CWD", "/"), pg_timeout_s=60.0, run_id=uuid.uuid4().hex,
                    address="127.0.0.1", cluster="session_launcher_test", caller_account=account)
    results = tempfile.mkdtemp()  # the service account's own, 0700: the rank writes through its descriptor
    result_path = os.path.join(results, "result")
    result_fd = bulk.result_file(result_path)
    pid, conn = launcher.fork(account=account)
    handoff.send(conn.fileno(), None, result_fd)
    os.close(result_fd)
    say({"forked": pid})
    conn.send(m.Launch(spec, cloudpickle.dumps((namespace["fn"], (), {})), None, (), "", ()))
    outcome: dict = {"error": "the rank ended without a result"}
    try:
        while True:
            item = wire.decode(conn.recv_bytes(), conn.recv_bytes)
            if isinstance(item, m.RankError):
                outcome = {"error": f"{item.type}: {item.message}"}
            elif isinstance(item, m.Pickled):
                outcome = {"value": bulk.loads_value(item) if not item.bulk_sizes else None}
    except EOFError:
        pass
    status = launcher.exit_status(pid, 30.0)  # told once everything the rank left is gone
    store.close()
    launcher.kill(store_pid)
    launcher.exit_status(store_pid, 10.0)
    say({**outcome, "status": status})
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
