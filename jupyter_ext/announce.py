"""The file that tells this user's `gpusession` CLI where a gpusession server runs, so `gpusession
status`, `leases` and `quota` answer through its REST API in well under a second instead of
joining Ray (see gpusession.cli_access). Written privately in Jupyter's runtime directory, like
Jupyter's own jpserver-<pid>.json (which holds the same token); removed at shutdown."""
from __future__ import annotations

import json
import os

from jupyter_core.paths import secure_write

from gpusession.cli_access import announce_path


def write(serverapp, ray_address: str) -> None:
    record = {"url": serverapp.connection_url, "token": serverapp.identity_provider.token,
              "ray_address": ray_address, "pid": os.getpid()}
    path = announce_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with secure_write(str(path)) as out:
        json.dump(record, out)


def remove() -> None:
    announce_path().unlink(missing_ok=True)
