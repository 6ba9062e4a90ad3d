"""Every example notebook (but the quickstart, tested by the demo) runs top to bottom through
nbclient in a real kernel, and what it saves includes the live plot's final image. The detach
example runs its first half in one kernel, which then ends, and its second half in a new one."""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
RESTARTING = "detach.ipynb"
NOTEBOOKS = sorted(p for p in EXAMPLES.glob("*.ipynb") if p.name not in ("quickstart.ipynb", RESTARTING))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_example_notebook_runs_top_to_bottom_and_saves_its_plot(path, cluster, tmp_path):
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(notebook, kernel_name="python3", timeout=180,
                            resources={"metadata": {"path": str(EXAMPLES)}})
    client.execute(env=cluster.env())  # raises CellExecutionError, with the cell, if one fails
    saved = tmp_path / path.name
    nbformat.write(notebook, saved)
    outputs = [o for cell in nbformat.read(saved, as_version=4).cells for o in cell.get("outputs", [])]
    assert any("image/png" in o.get("data", {}) for o in outputs), "no plot image was saved"
    assert any("released" in o.get("data", {}).get("text/plain", "") for o in outputs), "no receipt"


def test_the_detach_example_gets_its_runs_value_in_a_new_kernel_after_the_first_one_ended(cluster, tmp_path):
    from .test_gateway_runs import stop_user_gateways, user_kernel_env

    notebook = nbformat.read(EXAMPLES / RESTARTING, as_version=4)
    split = next(i for i, cell in enumerate(notebook.cells) if "restart-kernel" in cell.metadata.get("tags", []))
    home = tempfile.mkdtemp(prefix="gs-example-home-")  # the user's own gateway lives here; stopped after
    env = {**cluster.env(), **user_kernel_env(cluster, home)}
    try:
        halves = []
        for cells in (notebook.cells[:split], notebook.cells[split:]):  # a new kernel for the second half
            half = nbformat.v4.new_notebook(cells=cells, metadata=notebook.metadata)
            NotebookClient(half, kernel_name="python3", timeout=180,
                           resources={"metadata": {"path": str(tmp_path)}}).execute(env=env)
            halves.append(half)
        first = "".join(o.get("text", "") for c in halves[0].cells for o in c.get("outputs", []))
        assert "detached run " in first, first
        run_id = first.split("detached run ")[1].split()[0]
        outputs = [o for c in halves[1].cells for o in c.get("outputs", [])]
        listed = "".join(o.get("text", "") for o in outputs)
        assert listed.startswith(f"{run_id} "), listed  # the new kernel found it by name, newest first
        value = next(o["data"]["text/plain"] for o in outputs if o.get("output_type") == "execute_result")
        assert "'world_size': 2" in value and "'final_loss'" in value, value
        assert any("image/png" in o.get("data", {}) for o in outputs), "the attached run's plot was not drawn"
        assert "epoch 16: loss" in str(outputs), "the attached run's output was not shown"
    finally:
        stop_user_gateways(home)
        shutil.rmtree(home, ignore_errors=True)
