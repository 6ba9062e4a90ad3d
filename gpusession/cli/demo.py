"""`gpusession demo`: run the quickstart notebook headless in a fresh kernel, print what it showed."""
from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

from ..run.node import leftovers

QUICKSTART = "quickstart.ipynb"


def find_quickstart() -> Path:
    """The repo's examples/ (a checkout), else the copy pip installed under share/gpusession."""
    candidates = [
        Path(__file__).resolve().parents[2] / "examples" / QUICKSTART,
        Path(sys.prefix) / "share" / "gpusession" / "examples" / QUICKSTART,
    ]
    for path in candidates:
        if path.exists():
            return path
    raise FileNotFoundError(f"{QUICKSTART} not found in {', '.join(str(c) for c in candidates)}.")


def run_demo(*, notebook: str | None = None, timeout: float = 600) -> int:
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    path = Path(notebook) if notebook else find_quickstart()
    nb = nbformat.read(path, as_version=4)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # the embedded default cluster
    print(f"gpusession demo: running {path} in a fresh kernel (starts a local Ray head; ~30 s)...", flush=True)
    started = time.monotonic()
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}})
    # The kernel's own stderr (Ray's process logs, its shutdown noise) goes to a file, not here:
    # what the notebook shows arrives through the cells' outputs.
    log_path = Path(tempfile.mkstemp(prefix="gpusession-demo-kernel-", suffix=".log")[1])
    failed = None
    before = leftovers.Snapshot.now()
    with open(log_path, "w") as kernel_log:
        try:
            client.execute(env=env, stderr=kernel_log)
        except CellExecutionError as exc:
            failed = exc
        finally:
            before.remove_new()  # the embedded cluster's warm and scratch folders, gone with its kernel
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            _print_outputs(index, cell)
    if failed is not None:
        print(f"gpusession demo: a cell failed (kernel log: {log_path})", file=sys.stderr)
        return 1
    log_path.unlink(missing_ok=True)  # kept only when a cell failed: then it may say why
    print(f"gpusession demo: done in {time.monotonic() - started:.0f} s", flush=True)
    return 0


def _print_outputs(index: int, cell) -> None:
    for output in cell.get("outputs", []):
        if output.output_type == "stream":
            sys.stdout.write(output.text)
        elif output.output_type in ("execute_result", "display_data"):
            data = output.get("data", {})
            if "image/png" in data:
                print(f"[cell {index}: a plot]")
            elif data.get("text/plain"):  # a metrics display no report filled stays empty: nothing to print
                print(data["text/plain"])
        elif output.output_type == "error":
            print(f"[cell {index} failed] {output.ename}: {output.evalue}")
    sys.stdout.flush()
