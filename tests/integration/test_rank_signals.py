"""A rank's signals are a fresh Python's, as under torchrun: Ray starts its processes with SIGINT
blocked (so a terminal's Ctrl-C leaves the cluster up), and a rank forked from the node's warm
parent inherited that mask, so a SIGINT to the rank, or to any program it started, did nothing."""
from __future__ import annotations

import signal

import ray


def test_a_rank_blocks_no_signal_and_sigint_reaches_it_and_the_programs_it_starts(cluster, quiet):
    import gpusession as gs

    @gs.distributed(gpus=2, return_all=True)
    def signals():
        import os
        import subprocess

        blocked = sorted(signal.pthread_sigmask(signal.SIG_BLOCK, ()))
        try:
            os.kill(os.getpid(), signal.SIGINT)  # Python's own handler: KeyboardInterrupt
            signal.pthread_sigmask(signal.SIG_BLOCK, ())  # a pending signal's handler runs by here
            interrupted = False
        except KeyboardInterrupt:
            interrupted = True
        child = subprocess.Popen(["sleep", "60"])
        child.send_signal(signal.SIGINT)
        return {"blocked": blocked, "interrupted": interrupted, "child_code": child.wait(timeout=10)}

    @ray.remote(num_cpus=0)
    def ray_task_blocked():
        return sorted(signal.pthread_sigmask(signal.SIG_BLOCK, ()))

    assert signals() == [{"blocked": [], "interrupted": True, "child_code": -signal.SIGINT}] * 2
    assert ray.get(ray_task_blocked.remote()) == [signal.SIGINT]  # what Ray's own workers have, for contrast
