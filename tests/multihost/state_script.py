"""A script on a head of a simulated cluster (RAY_ADDRESS is set): where this cluster's broker
keeps its state, as an admin's shell on the head finds it.

    python state_script.py

Prints `STATE {json}`: the ledger's path and id, the admin token and the identity key."""
from __future__ import annotations

import json
import socket

from gpusession.broker import client
from gpusession.broker.storage.secrets import identity_key_path


def main() -> None:
    info = client.call(client.broker().info)  # starts this cluster's broker if it is not running
    ledger = client.ledger_path_here()
    print("STATE " + json.dumps({
        "host": socket.gethostname(), "ledger": ledger, "ledger_id": info["ledger_id"],
        "admin_token": client.admin_token_here(), "identity_key": identity_key_path(ledger).read_text().strip(),
    }), flush=True)


if __name__ == "__main__":
    main()
