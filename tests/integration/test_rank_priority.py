"""Ranks train at the machine's normal priority: Ray starts its own workers at niceness 15, and a
rank forked from the node's warm parent inherited that, so any process at 0 on a busy node (a data
loader, torchrun's ranks, another job) took the CPU from the training."""
from __future__ import annotations

import os

import ray


def test_ranks_run_at_niceness_0_where_a_plain_ray_task_runs_at_15(cluster, quiet):
    import gpusession as gs

    @gs.distributed(gpus=2, return_all=True)
    def niceness():
        return os.nice(0)

    @ray.remote(num_cpus=0)
    def ray_task_niceness():
        return os.nice(0)

    assert niceness() == [0, 0]
    assert ray.get(ray_task_niceness.remote()) == 15  # Ray's default for its workers, for contrast
