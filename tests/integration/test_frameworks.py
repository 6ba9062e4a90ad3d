"""Frameworks run unmodified under @gs.distributed with torchrun's process semantics: Accelerate,
Hugging Face Trainer and Lightning each see 2 processes, distributed, replicas in sync after a
step; and they see exactly what they see under torchrun with what `accelerate launch --cpu` sets
(ACCELERATE_USE_CPU), which gpusession sets by itself on logical GPUs."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import gpusession as gs

from . import frameworks_probe

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def under_gpusession(cluster, tmp_path_factory) -> list[dict]:
    from gpusession.observe import events

    events.set_observer_factory(lambda world_size: events.Observer())
    try:
        out = str(tmp_path_factory.mktemp("frameworks-gs"))
        return gs.distributed(gpus=2, return_all=True)(frameworks_probe.run_all)(out)
    finally:
        events.set_observer_factory(None)


@pytest.fixture(scope="module")
def under_torchrun(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("frameworks-torchrun") / "seen.json"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["ACCELERATE_USE_CPU"] = "true"  # what `accelerate launch --cpu` sets
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         f"--log-dir={out.parent / 'torchrun-logs'}",  # not a torchelastic_* folder left in /tmp
         str(HERE / "frameworks_probe.py"), str(out)],
        env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return [json.loads(Path(f"{out}.{rank}").read_text()) for rank in range(2)]


@pytest.mark.parametrize("framework", ["accelerate", "trainer", "lightning"])
def test_each_framework_sees_two_processes_and_keeps_replicas_in_sync(under_gpusession, framework):
    views = [rank[framework] for rank in under_gpusession]
    assert [v["processes"] for v in views] == [2, 2]
    assert [v["index"] for v in views] == [0, 1]
    assert all(v["in_sync"] for v in views)
    assert "MULTI_CPU" in views[0]["type"] or "DISTRIBUTED" in views[0]["type"] or views[0]["type"] == "DDPStrategy"


@pytest.mark.parametrize("framework", ["accelerate", "trainer", "lightning"])
def test_each_framework_sees_what_it_sees_under_torchrun(under_gpusession, under_torchrun, framework):
    assert [r[framework] for r in under_gpusession] == [r[framework] for r in under_torchrun]
