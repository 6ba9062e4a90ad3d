"""The same seeded DDP training under torchrun and under @gs.distributed ends with the same
parameters: gpusession is a launcher, not a different training algorithm."""
from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import gpusession as gs

from . import ddp_train

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def torchrun_parameters(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("torchrun") / "state.pt"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={port}",
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
