"""A rank keeps the C heap memory it frees (run/rank/heap.py): a training step's activations,
allocated together and freed together, reuse the same memory at the next step instead of
faulting in fresh pages from the OS. A rank forked from the warm parent had faulted in ~960
pages every step of a small model, and trained 14 % slower for it."""
from __future__ import annotations

import gpusession as gs

STEPS = 20
TENSORS = 32  # a step's activations: 32 tensors of 512 KB (16 MB), freed at the step's end
PAGES_PER_STEP = TENSORS * (512 << 10) // 4096  # 4,096 pages of 4 KB


def test_a_rank_reuses_a_steps_freed_memory_instead_of_faulting_in_fresh_pages_each_step(cluster, quiet):
    @gs.distributed(gpus=1)
    def faults_over_steps():
        import resource

        import torch

        def step():
            activations = [torch.ones(128 << 10) for _ in range(TENSORS)]  # every page written
            del activations

        step()  # the first step may fault its pages in once
        before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        for _ in range(STEPS):
            step()
        return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before

    faults = faults_over_steps()
    # A step whose memory went back to the OS at its end would fault in PAGES_PER_STEP again.
    assert faults < PAGES_PER_STEP, (
        f"{faults} page faults over {STEPS} steps after the first: the rank gives a step's freed memory back to "
        f"the OS (each step taking its {PAGES_PER_STEP} pages again would be {STEPS * PAGES_PER_STEP})")
