"""`python -m gpusession.hub.noderay RAY_START_OPTIONS...`: the Ray node of `gpusession hub node`,
run as the service account (never root, never a user). It makes the account's own temporary
directory (GPUSESSION_HOME/tmp, 0700: root acts in no directory of the service account), then
becomes `ray start` with those options (the same process: the node command stops it by its pid)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

from .service import make_private_tmp


def main(argv: list[str]) -> None:
    make_private_tmp(Path(os.environ["GPUSESSION_HOME"]))
    os.execv(sys.executable, [sys.executable, "-m", "ray.scripts.scripts", "start", *argv])


if __name__ == "__main__":
    main(sys.argv[1:])
