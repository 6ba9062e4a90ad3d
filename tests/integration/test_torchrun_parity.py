"""The same seeded DDP training under torchrun and under @gs.distributed ends with the same
parameters: gpusession is a launcher, not a different training algorithm. A script's own
init_process_group and destroy_process_group calls work as they do under torchrun."""
from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.distributed import destroy_process_group, init_process_group  # bound as a script binds them

import gpusession as gs

from . import ddp_train

HERE = Path(__file__).parent
SCRIPT_TIMEOUT_S = 3.0  # the script's own init_process_group(timeout=...); gpusession's is 1800 s. It also bounds
# the rendezvous and the first collectives: 1 s could end those when a rank is descheduled here
TIMEOUT_MARGIN_S = 15.0  # gloo's timer on a loaded machine; far below gpusession's own timeout


@pytest.fixture(scope="module")
def torchrun_parameters(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("torchrun") / "state.pt"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={port}",
         f"--log-dir={out.parent / 'torchrun-logs'}",  # not a torchelastic_* folder left in /tmp
         str(HERE / "ddp_train.py"), str(out)],
        check=True, capture_output=True, timeout=180,
    )
    return torch.load(out)


def _assert_same(got: dict, expected: dict) -> None:
    assert got.keys() == expected.keys()
    for name in expected:
        assert torch.allclose(got[name], expected[name], rtol=0, atol=1e-6), name


def test_unmodified_torchrun_style_code_trains_to_the_same_parameters(cluster, quiet, torchrun_parameters):
    train = gs.distributed(gpus=2)(ddp_train.train_torchrun_style)
    _assert_same(train(), torchrun_parameters)


def test_prepare_model_and_prepare_loader_match_hand_written_ddp_under_torchrun(cluster, quiet, torchrun_parameters):
    train = gs.distributed(gpus=2)(ddp_train.train_with_gpusession_helpers)
    _assert_same(train(), torchrun_parameters)


def test_a_script_may_init_a_group_of_another_backend_with_its_timeout_and_destroy_it(cluster, quiet):
    @gs.distributed(gpus=2, return_all=True)
    def script():
        import os
        import time
        from datetime import timedelta

        import torch.distributed as dist

        # gloo under another name, as a third-party backend registers itself: not gpusession's gloo
        dist.Backend.register_backend("gloo_by_another_name", dist.ProcessGroupGloo, devices=["cpu"])
        init_process_group("gloo_by_another_name", init_method="env://",
                           timeout=timedelta(seconds=SCRIPT_TIMEOUT_S))
        seen = {"backend": dist.get_backend(), "rank": dist.get_rank(), "world": dist.get_world_size(),
                "local_rank": int(os.environ["LOCAL_RANK"])}
        total = torch.ones(1)
        dist.all_reduce(total)
        dist.barrier()
        seen["sum"] = total.item()
        # Rank 0 alone in a collective: the script's timeout ends it, not gpusession's.
        timed_out = os.path.join(gs.context().scratch_dir, "rank-0-timed-out")
        if dist.get_rank() == 0:
            started = time.monotonic()
            with pytest.raises(RuntimeError):
                dist.all_reduce(torch.ones(1))
            seen["gave_up_after_s"] = time.monotonic() - started
            open(timed_out, "w").close()
        deadline = time.monotonic() + TIMEOUT_MARGIN_S
        while not os.path.exists(timed_out) and time.monotonic() < deadline:
            time.sleep(0.01)
        destroy_process_group()
        init_process_group()  # again after its own destroy: a fresh group, as under torchrun
        total = torch.ones(1)
        dist.all_reduce(total)
        seen["sum_after_init_again"] = total.item()
        destroy_process_group()
        return seen

    seen = script()
    assert [s["rank"] for s in seen] == [0, 1] and [s["local_rank"] for s in seen] == [0, 1]
    assert all(s["backend"] == "gloo_by_another_name" and s["world"] == 2 for s in seen)
    assert all(s["sum"] == 2 and s["sum_after_init_again"] == 2 for s in seen)
    assert SCRIPT_TIMEOUT_S <= seen[0]["gave_up_after_s"] < SCRIPT_TIMEOUT_S + TIMEOUT_MARGIN_S
