"""gs.sweep on the session cluster (4 logical GPUs, real broker, real Optuna): trials are leases
of their own, at most `parallel` at once; pruned trials stop early and give their GPUs back; a
raising trial is recorded as failed; Ctrl-C releases everything and the same call resumes."""
from __future__ import annotations

import _thread
import threading
import time

import optuna
import pytest

import gpusession as gs
from gpusession.broker import client
from gpusession.sweeps import TrialState
from ..conftest import CLUSTER_GPUS, free_gpus, wait_for

STEPS = 6
OPTIMUM = 0.3
FAILS_BELOW = 0.08  # a trial whose x is below this raises (with seed 2, one of the 16 does)


def quadratic(x: float, steps: int = STEPS) -> dict:
    """val_loss falls with the steps and is lowest at x = OPTIMUM: the best trial is known."""
    import time as clock

    import gpusession as gs

    if x < FAILS_BELOW:
        raise RuntimeError(f"diverged at x={x:.3f}")
    for step in range(steps):
        clock.sleep(0.05)
        gs.report(step=step, val_loss=(x - OPTIMUM) ** 2 + 0.2 / (step + 1))
    return {"x": x}


class LeaseCounter:
    """Watches the broker's open leases (queued or granted) while a sweep runs."""

    def __init__(self, admin: dict) -> None:
        self.admin, self.most, self.samples = admin, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        broker = client.broker()
        while not self._stop.is_set():
            self.most = max(self.most, len(client.call(broker.leases, self.admin)))
            self.samples += 1
            time.sleep(0.02)

    def __enter__(self) -> "LeaseCounter":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)


def test_sixteen_trials_run_four_at_a_time_prune_early_record_failures_and_find_the_best(cluster, admin):
    with LeaseCounter(admin) as leases:
        # half a GPU per trial: the cluster could hold 8 trials, so only `parallel` holds it to 4
        result = gs.sweep(quadratic, {"x": gs.uniform(0.0, 1.0)}, trials=16, parallel=4, objective="val_loss",
                          mode="min", sampler="random", seed=2, pruner="asha", gpus=0.5, gpus_per_worker=0.5)

    assert leases.samples > 10 and 2 <= leases.most <= 4
    assert free_gpus() == CLUSTER_GPUS
    trials = result.trials
    assert len(trials) == 16 and all(t.state.is_terminal for t in trials)
    failed = [t for t in trials if t.state is TrialState.FAILED]
    assert failed and failed == [t for t in trials if t.params["x"] < FAILS_BELOW]
    assert all("diverged" in t.error for t in failed)
    pruned = [t for t in trials if t.state is TrialState.PRUNED]
    assert pruned, "ASHA pruned nothing"
    for trial in pruned:  # stopped early, and its GPUs back within 1 s of the decision
        assert trial.reports < STEPS
        assert trial.ended_at - trial.pruned_at < 1.0
    complete = [t for t in trials if t.state is TrialState.COMPLETE]
    assert all(t.reports == STEPS for t in complete)
    best = min(complete, key=lambda t: t.value)
    assert result.best.number == best.number and result.best.value == best.value
    assert result.best.params == best.params and result.best.result == {"x": best.params["x"]}
    assert result.best.value == result.study.best_value
    assert abs(result.best.params["x"] - OPTIMUM) == min(abs(t.params["x"] - OPTIMUM) for t in complete)


def slow_quadratic(x: float) -> dict:
    import time as clock

    import gpusession as gs

    for step in range(4):
        clock.sleep(0.1)
        gs.report(step=step, val_loss=(x - 0.3) ** 2)
    return {"x": x}


def test_an_interrupted_sweep_releases_every_gpu_and_the_same_call_runs_only_the_missing_trials(cluster, tmp_path):
    storage = f"sqlite:///{tmp_path / 'sweep.db'}"
    watched = optuna.storages.RDBStorage(storage)  # its tables exist before the sweep opens it too
    call = dict(trials=6, parallel=2, objective="val_loss", sampler="random", seed=7, pruner=None,
                storage=storage, study_name="resumable")

    def finished_in_storage() -> int:
        try:
            study = optuna.load_study(study_name="resumable", storage=watched)
        except KeyError:  # the sweep has not created it yet
            return 0
        return sum(1 for t in study.get_trials(deepcopy=False) if t.state == optuna.trial.TrialState.COMPLETE)

    sweep_over = threading.Event()

    def ctrl_c_after_two_trials() -> None:
        wait_for(lambda: sweep_over.is_set() or finished_in_storage() >= 2, timeout=120, interval=0.05,
                 message="two trials finished")
        if not sweep_over.is_set():  # a late Ctrl-C would land after the test and stop the whole session
            _thread.interrupt_main()  # what the notebook's stop button does to the kernel's main thread

    watcher = threading.Thread(target=ctrl_c_after_two_trials, daemon=True)
    watcher.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            gs.sweep(slow_quadratic, {"x": gs.uniform(0.0, 1.0)}, **call)
    finally:
        sweep_over.set()
        watcher.join(5)
    assert free_gpus() == CLUSTER_GPUS  # every trial's GPUs were back before the call raised
    done_before = finished_in_storage()
    assert 2 <= done_before < 6

    result = gs.sweep(slow_quadratic, {"x": gs.uniform(0.0, 1.0)}, **call)

    ran_now = [t for t in result.trials if t.ran_here]
    counted = [t for t in result.trials if t.state.counts]
    assert len(ran_now) == 6 - done_before  # only the missing trials ran
    assert len(counted) == 6 and all(t.state is TrialState.COMPLETE for t in counted)
    interrupted = [t for t in result.trials if t.state is TrialState.INTERRUPTED]
    assert all(not t.ran_here for t in interrupted)
    assert result.best.value == min(t.value for t in counted)


DEMANDS_TWO_GPUS_WHEN_TOLD = """
import os, time
import gpusession as gs
gs.status()  # connected, and the broker found, before the sweep starts
print("READY", flush=True)
while not os.path.exists(os.environ["GO_FILE"]):
    time.sleep(0.02)
with gs.lease(gpus=2, priority="normal") as lease:
    print(f"GRANTED after {lease.info.queued_s:.2f} s", flush=True)  # request to grant
    time.sleep(1.0)
print("RELEASED", flush=True)
"""
STEPS_WITH_CHECKPOINTS = 12


def checkpointed(x: float, markers: str) -> dict:
    """Checkpoints every step; a marker file says it runs (from its first checkpoint to its end)."""
    import os
    import time as clock

    import gpusession as gs

    marker = os.path.join(markers, f"{x}.running")
    start = gs.load_checkpoint() or {"step": 0}
    for step in range(start["step"], STEPS_WITH_CHECKPOINTS):
        clock.sleep(0.25)
        gs.report(step=step, val_loss=(x - 0.3) ** 2 + 1.0 / (step + 1))
        gs.save_checkpoint({"step": step + 1})
        open(marker, "w").close()
    os.remove(marker)
    return {"x": x, "resumed_from": start["step"]}


def test_a_low_priority_sweep_yields_gpus_to_another_user_and_loses_no_trial(cluster, driver, tmp_path):
    gs.distributed(gpus=4)(lambda: None)()  # four warm workers, as in a kernel after its first calls
    go = tmp_path / "go"
    other = driver(DEMANDS_TWO_GPUS_WHEN_TOLD, GPUSESSION_USER="interactive-user", GO_FILE=str(go))
    other.wait_for_line("READY")

    def demand_gpus_once_four_trials_run() -> None:
        wait_for(lambda: len(list(tmp_path.glob("*.running"))) == 4, timeout=240, interval=0.02,
                 message="four trials running at once")
        go.touch()

    thread = threading.Thread(target=demand_gpus_once_four_trials_run, daemon=True)
    thread.start()
    result = gs.sweep(checkpointed, {"x": gs.uniform(0.0, 1.0), "markers": str(tmp_path)}, trials=6, parallel=4,
                      sampler="random", seed=3, pruner=None, priority="low", gpus=1)
    thread.join(5)

    granted = other.wait_for_line("GRANTED")
    assert float(granted.split()[2]) < 3.0 + 3.0  # the preemption grace (3 s here) plus margin
    other.wait_for_line("RELEASED")
    assert len(result.trials) == 6 and all(t.state is TrialState.COMPLETE for t in result.trials)
    preempted = [t for t in result.trials if t.preemptions]
    assert len(preempted) >= 2  # the other user needed 2 of the 4 GPUs
    for trial in preempted:  # continued from its checkpoint: no step lost, none repeated
        assert [report["step"] for report in trial.history] == list(range(STEPS_WITH_CHECKPOINTS))
        assert len(trial.lease_ids) == trial.preemptions + 1
    assert free_gpus() == CLUSTER_GPUS


def always_raises(x: float) -> None:
    raise ValueError(f"bad batch at x={x:.2f}")


def test_a_sweep_stops_after_max_failed_trials_and_says_why(cluster):
    with pytest.raises(gs.SweepFailed, match=r"2 trials failed \(max_failed=2\).*ValueError: bad batch") as stopped:
        gs.sweep(always_raises, {"x": gs.uniform(0.0, 1.0)}, trials=8, parallel=1, max_failed=2, gpus=1)

    trials = stopped.value.result.trials
    assert len(trials) == 2 and all(t.state is TrialState.FAILED for t in trials)  # no third trial started
    assert free_gpus() == CLUSTER_GPUS
