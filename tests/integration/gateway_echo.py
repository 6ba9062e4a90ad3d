"""A gateway session that does nothing but answer (for tests/integration/test_gateway_limits.py):
it says who it serves, then answers each message with its kind and frame sizes until the caller
closes. Run as a module, a server of its own: `python -m tests.integration.gateway_echo SOCKET
NOFILE` (NOFILE: its descriptor limit, 0 to keep it), "ready" on stdout, until stdin closes."""
from __future__ import annotations

import logging
import resource
import sys

from gpusession.gateway.kinds import Kind
from gpusession.gateway.server import GatewayServer


def echo(conn, caller, hello) -> None:
    conn.send(Kind.RESULT, user=caller.user)
    while True:
        message = conn.receive()
        conn.send(Kind.RESULT, kind_seen=message.kind.value, sizes=[len(p) for p in message.payload])


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    if int(sys.argv[2]):
        resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[2]), int(sys.argv[2])))
    server = GatewayServer(sys.argv[1], {"run": echo}).start()
    print("ready", flush=True)
    sys.stdin.read()
    server.stop()
