"""Call-to-result of a trivial 2-worker allreduce on a warm cluster: @gs.distributed vs Ray
Train's TorchTrainer.fit() (gloo, the same logical GPUs), measured side by side in one run.

    .venv/bin/python benchmarks/call_overhead.py [--calls 20] [--fits 2]

Both sides reserve 2 GPUs, start 2 ranks with a gloo process group, all-reduce one tensor and
return. gpusession's warm path reuses worker processes that already imported torch; Ray Train
starts a trainer, a controller and fresh workers on every fit(). Target ratio: <= 0.10.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from _cluster import local_cluster, median, timed  # noqa: E402


def gpusession_call_seconds(calls: int) -> list[float]:
    import gpusession as gs
    from gpusession import events

    events.set_observer_factory(lambda world_size: events.Observer())  # measure the call, not printing

    @gs.distributed(gpus=2)
    def allreduce():
        import torch
        import torch.distributed as dist

        value = torch.ones(1)
        dist.all_reduce(value)
        return value.item()

    assert allreduce() == 2.0  # cold: starts the broker and the warm workers
    allreduce()
    return timed(allreduce, calls)


def ray_train_fit_seconds(fits: int) -> list[float]:
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    def train_loop():
        import torch
        import torch.distributed as dist

        value = torch.ones(1)
        dist.all_reduce(value)

    storage = tempfile.mkdtemp(prefix="raytrain-bench-")

    def fit():
        trainer = TorchTrainer(
            train_loop,
            torch_config=TorchConfig(backend="gloo"),
            scaling_config=ScalingConfig(num_workers=2, use_gpu=True, resources_per_worker={"GPU": 1, "CPU": 0}),
            run_config=RunConfig(storage_path=storage),
        )
        trainer.fit()

    return timed(fit, fits)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20, help="warm @gs.distributed calls to time")
    parser.add_argument("--fits", type=int, default=2, help="TorchTrainer.fit() calls to time")
    args = parser.parse_args()
    with local_cluster():
        gs_times = gpusession_call_seconds(args.calls)
        rt_times = ray_train_fit_seconds(args.fits)
    gs_median, rt_median = median(gs_times), median(rt_times)
    print(f"@gs.distributed(gpus=2), warm: median {gs_median:.3f} s over {len(gs_times)} calls "
          f"(min {min(gs_times):.3f}, max {max(gs_times):.3f})")
    print(f"TorchTrainer.fit(), 2 workers: median {rt_median:.2f} s over {len(rt_times)} fits "
          f"(min {min(rt_times):.2f}, max {max(rt_times):.2f})")
    print(f"ratio gpusession/ray_train: {gs_median / rt_median:.4f} (target <= 0.10)")


if __name__ == "__main__":
    main()
