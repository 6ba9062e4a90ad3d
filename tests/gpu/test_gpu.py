"""What only a machine with CUDA GPUs can show: nccl at one rank and at two, each lease's
CUDA_VISIBLE_DEVICES, two leases on different GPUs of one node, and GPU memory back to zero after
every kind of ending. Each test runs tests/gpu/gpu_script.py in a fresh process on the embedded
default cluster (its own Ray head with this machine's GPUs, free ports, its own GPUSESSION_HOME).

Skipped with the reason on a machine without CUDA (listed in tests/expected_skips.toml); run them
on a GPU machine with `pytest -m gpu tests/gpu` (tests/README.md)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ..machine import cuda_gpus

SCRIPT = Path(__file__).with_name("gpu_script.py")
ROOT = SCRIPT.parent.parent.parent
pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600),
              pytest.mark.skipif(cuda_gpus() == 0, reason="no CUDA on this machine (torch.cuda.is_available() "
                                                         "is False); run on a GPU machine: pytest -m gpu tests/gpu")]
two_gpus = pytest.mark.skipif(cuda_gpus() < 2, reason=f"needs 2 CUDA GPUs; this machine has {cuda_gpus()}")


def scenario(tmp_path, *args: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "CUDA_VISIBLE_DEVICES")}
    env.update(GPUSESSION_HOME=str(tmp_path), PYTHONUNBUFFERED="1")
    done = subprocess.run([sys.executable, str(SCRIPT), *args], env=env, cwd=str(ROOT), capture_output=True,
                          text=True, timeout=540)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, f"{args} exited {done.returncode}:\n{done.stdout}\n{done.stderr[-4000:]}"
    return json.loads(lines[-1][len("RESULT "):])


def test_one_rank_uses_nccl_on_its_one_visible_cuda_gpu(tmp_path):
    result = scenario(tmp_path, "allreduce", "1")
    assert (result["backend"], result["device"], result["sum"]) == ("nccl", "cuda", 1.0), result
    assert result["torch_sees"] == 1 and result["visible"].isdigit(), result


@two_gpus
def test_two_ranks_allreduce_with_nccl_each_on_its_own_gpu(tmp_path):
    result = scenario(tmp_path, "allreduce", "2")
    assert (result["backend"], result["device"], result["sum"]) == ("nccl", "cuda", 3.0), result  # 1 + 2
    assert len(result["visible"].split(",")) == 2 and result["torch_sees"] == 2, result


@two_gpus
def test_two_leases_on_one_node_get_different_gpus_and_each_sees_only_its_own(tmp_path):
    first, second = scenario(tmp_path, "two_leases")["leases"]
    for lease in (first, second):
        assert lease["visible"].split(",") == lease["slots"] and lease["torch_sees"] == 1, lease
    assert first["visible"] != second["visible"] and first["uuid"] != second["uuid"], (first, second)


@pytest.mark.parametrize("kind, raised", [
    ("finished", "returned"), ("user_error", "WorkerFailed"), ("timeout", "RunTimeout"),
    ("rank_killed", "WorkerFailed"), ("interrupt", "KeyboardInterrupt"), ("revoked", "LeaseRevoked"),
])
def test_gpu_memory_is_back_to_zero_when_the_call_returns_after_every_kind_of_ending(tmp_path, kind, raised):
    result = scenario(tmp_path, "ending", kind)
    assert result["nvml"], "NVML did not start: GPU memory could not be read"
    assert result["outcome"] == raised, result
    assert result["left"] == {}, (f"{kind}: processes still hold GPU memory {result['after_s']} s after the call "
                                  f"returned (bound: 5 s): {result['left']}")
