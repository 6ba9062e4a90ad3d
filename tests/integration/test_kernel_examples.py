"""Every example notebook (but the quickstart, tested by the demo) runs top to bottom through
nbclient in a real kernel, and what it saves includes the live plot's final image."""
from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NOTEBOOKS = sorted(p for p in EXAMPLES.glob("*.ipynb") if p.name != "quickstart.ipynb")


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
