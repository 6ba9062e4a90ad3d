"""A %%gpu cell run by an IPython shell inside the test process, on the session cluster: the fast
loop's check of the magic's run path (a kernel of its own is slow; tests/integration/
test_kernel_magics.py drives the same cells through a real kernel in the full suite)."""
from __future__ import annotations

import pytest
from IPython.core.interactiveshell import InteractiveShell

from ..conftest import CLUSTER_GPUS, free_gpus


@pytest.fixture
def shell(cluster, quiet):
    shell = InteractiveShell.instance()
    try:
        for setup in ("%load_ext gpusession", "import torch, gpusession as gs"):
            shell.run_cell(setup).raise_error()
        yield shell
    finally:
        InteractiveShell.clear_instance()  # the next test's process state has no shell in it


def test_a_gpu_cell_brings_its_names_back_and_its_last_expression_is_the_result(shell):
    shell.run_cell("base = 10").raise_error()
    run = shell.run_cell("""%%gpu 2
rank = gs.context().rank
world = gs.context().world_size
t = torch.full((2,), float(base + rank))
t.sum().item() + world
""")
    run.raise_error()
    assert run.result == 22.0  # rank 0: 10 + 10, plus world size 2
    namespace = shell.user_ns
    assert (namespace["rank"], namespace["world"], namespace["t"].tolist()) == (0, 2, [10.0, 10.0])
    assert (namespace["_gpu"].gpus, namespace["_gpu"].end_reason, namespace["_gpu"].released) == (2, "finished", True)
    assert free_gpus() == CLUSTER_GPUS


def test_a_failing_rank_fails_the_cell_with_its_remote_traceback_and_frees_the_gpus(shell):
    run = shell.run_cell("""%%gpu 2
if gs.context().rank == 1:
    raise ValueError("bad batch 17")
torch.distributed.barrier()
""")
    assert type(run.error_in_exec).__name__ == "WorkerFailed", run.error_in_exec
    assert "bad batch 17" in str(run.error_in_exec)
    assert (shell.user_ns["_gpu"].end_reason, shell.user_ns["_gpu"].released) == ("failed", True)
    assert free_gpus() == CLUSTER_GPUS
