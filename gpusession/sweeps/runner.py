"""Run a sweep's trials: at most `parallel` at once, each in a thread of the caller, each its own
lease (asked for when the thread is free, released when the trial ends).

Optuna decides what to try (ask) and what to stop (should_prune); this module only feeds it
and acts: a pruned trial's run is torn down at once, a preempted one is queued again and
continues from its last checkpoint, a failed one is recorded, and the sweep stops after
`max_failed`. Ctrl-C in the caller's thread stops every trial and waits for their GPUs.
"""
from __future__ import annotations

import threading
import time
from typing import Any

from ..api.distributed import DistributedFunction
from ..errors import Infeasible, Preempted, QuotaExceeded
from ..run.caller.interrupts import deferred_interrupts
from .plan import SweepPlan
from .records import TrialRecord, TrialState, objective_value, record_from_frozen
from .trial import StopReason, StopSignal, TrialObserver
from .view import SweepBoard
from .warm import gpu_nodes, wait_for_warm_workers

JOIN_EVERY_S = 0.1  # how often the caller's thread draws and notices Ctrl-C
STOP_WAIT_S = 60.0  # bound on waiting for stopped trials to release their GPUs
STATE_ATTR = "gpusession_state"  # a FAIL in Optuna that was an interruption, not a failure


def counts_toward_budget(frozen) -> bool:
    """Trials that used up one of `trials`: finished ones, not interrupted or still running."""
    from optuna.trial import TrialState as OptunaState

    if frozen.state in (OptunaState.COMPLETE, OptunaState.PRUNED):
        return True
    return frozen.state == OptunaState.FAIL and frozen.user_attrs.get(STATE_ATTR) != TrialState.INTERRUPTED.value


class SweepRunner:
    def __init__(self, plan: SweepPlan, study, board: SweepBoard) -> None:
        self.plan, self.study, self.board = plan, study, board
        self.lock = threading.Lock()  # the runner's counters, and every Optuna call
        self.stop = StopSignal()
        self.fatal: BaseException | None = None
        self.failed: list[TrialRecord] = []
        self.best_kept: tuple[int, float, Any] | None = None  # (number, value, return value)
        self._close_abandoned_trials()
        self.earlier = [record_from_frozen(t, better=plan.mode.better) for t in study.trials]
        for record in self.earlier:
            board.changed(record)
        self.to_start = max(0, plan.budget() - sum(1 for t in study.trials if counts_toward_budget(t)))
        self.ran: list[TrialRecord] = []

    def _close_abandoned_trials(self) -> None:
        """Trials left RUNNING by a kernel that died: closed as interrupted, so they neither count
        nor keep TPE's constant liar lying about them. (One kernel runs a study at a time.)"""
        from optuna.trial import TrialState as OptunaState

        from optuna.exceptions import UpdateFinishedTrialError

        for frozen in self.study.get_trials(deepcopy=False, states=(OptunaState.RUNNING,)):
            try:
                self.study._storage.set_trial_user_attr(frozen._trial_id, STATE_ATTR, TrialState.INTERRUPTED.value)
                self.study.tell(frozen.number, state=OptunaState.FAIL, skip_if_finished=True)
            except UpdateFinishedTrialError:  # it finished meanwhile: nothing was abandoned
                pass

    # ----- the caller's thread --------------------------------------------------------------------
    def run(self) -> None:
        from ..gateway.client import gateway_path

        if not gateway_path():  # through the gateway, trials run in the service: no Ray here
            from ..cluster import raycluster

            raycluster.ensure_connected()  # once, here, not raced by the trial threads
        threads = [threading.Thread(target=self._slot, name=f"gpusession-sweep-{i}", daemon=True)
                   for i in range(min(self.plan.parallel, self.to_start))]
        for thread in threads:
            thread.start()
        try:
            while any(thread.is_alive() for thread in threads):
                time.sleep(JOIN_EVERY_S)
                self.board.tick()
        except KeyboardInterrupt:
            self.stop.set(StopReason.INTERRUPTED)
            with deferred_interrupts():  # a second Ctrl-C must not leave trials holding GPUs
                # every started trial ends (its lease released); a slot still warming workers for
                # its next trial holds no GPU and starts nothing more
                deadline = time.monotonic() + STOP_WAIT_S
                while time.monotonic() < deadline and not all(r.state.is_terminal for r in list(self.ran)):
                    time.sleep(0.02)
            raise

    # ----- trial threads ----------------------------------------------------------------------------
    def _slot(self) -> None:
        from ..gateway.client import gateway_path

        workers, runtime_env = self.plan.run_options.lease.workers, self.plan.run_options.runtime_env
        warming = not gateway_path()  # the gateway's node hosts keep workers warm; a hub kernel has no Ray
        try:
            nodes = gpu_nodes() if warming else []
            if len(nodes) == 1:  # the first trial's node is known: warm it before leasing
                wait_for_warm_workers(nodes, workers, runtime_env)
            while True:
                job = self._next_trial()
                if job is None:
                    return
                used = self._run_trial(*job)
                if warming and self.to_start > 0 and not self.stop.reason:  # the next trial, likely on the same GPUs
                    wait_for_warm_workers(gpu_nodes(used), workers, runtime_env)
        except BaseException as exc:  # a broken storage, say: stop the sweep, and say why
            self.fatal = self.fatal or exc
            self.stop.set(StopReason.FAILED)

    def _next_trial(self):
        with self.lock:
            if self.stop.reason or self.to_start <= 0:
                return None
            self.to_start -= 1
            space = self.plan.space
            trial = self.study.ask(None if space.function else space.distributions())
            try:
                params = space.params_of(trial)
            except BaseException as exc:  # the user's space function raised: the sweep cannot go on
                self.study.tell(trial, state=_optuna_state(TrialState.FAILED))
                self.fatal = exc
                self.stop.set(StopReason.FAILED)
                return None
            record = TrialRecord(number=trial.number, params=dict(trial.params))
            self.ran.append(record)
        self.board.changed(record)
        return trial, params, record

    def _run_trial(self, trial, params: dict, record: TrialRecord) -> list[str]:
        """Run one trial to its end (re-queued after each preemption); returns its nodes' addresses."""
        import optuna

        observer = TrialObserver(record, trial, objective=self.plan.objective, better=self.plan.mode.better,
                                 board=self.board, stop=self.stop, optuna_lock=self.lock)
        fn = DistributedFunction(self.plan.fn, self.plan.run_options, observer=observer)
        checkpoint = None  # the trial's last checkpoint, over every attempt
        result, state = None, TrialState.FAILED
        while True:
            try:
                # what fn.resume() does, from the last checkpoint of any attempt (an attempt taken
                # back before it started saved none of its own)
                result, state = fn._run((), params, checkpoint_ref=checkpoint), TrialState.COMPLETE
            except optuna.TrialPruned:
                state = TrialState.PRUNED
            except Preempted:
                record.preemptions += 1
                if not self.stop.reason:  # back in the queue, to continue from its checkpoint
                    record.state = TrialState.REQUEUED
                    self.board.changed(record)
                    checkpoint = fn.last_run.checkpoint_ref or checkpoint  # kept in our object store
                    continue
                state = TrialState.INTERRUPTED
            except KeyboardInterrupt:
                state = TrialState.INTERRUPTED
            except (Infeasible, QuotaExceeded) as exc:  # every other trial would get the same answer
                self.fatal, state = exc, TrialState.INTERRUPTED
                self.stop.set(StopReason.FAILED)
            except Exception as exc:
                record.error = _first_line(exc)
            break
        if state is TrialState.COMPLETE and record.value is None:
            record.value = _returned_objective(result, self.plan.objective)
            if record.value is None:
                state = TrialState.FAILED
                record.error = (f"never reported {self.plan.objective!r}: call gs.report({self.plan.objective}=...) "
                                "in the function, or return that number")
            else:
                record.best = record.value
        self._tell(trial, record, state, result)
        return list(fn.last_run.nodes) if fn.last_run is not None else []

    def _tell(self, trial, record: TrialRecord, state: TrialState, result: Any) -> None:
        with self.lock:
            attrs = {"gpusession_gpu_seconds": record.gpu_seconds, "gpusession_reports": record.reports}
            if record.error:
                attrs["gpusession_error"] = record.error[:500]
            if state is TrialState.INTERRUPTED:
                attrs[STATE_ATTR] = state.value
            for key, value in attrs.items():
                trial.set_user_attr(key, value)
            value = record.value if state is TrialState.COMPLETE else None
            _tell_study(self.study, trial, value, _optuna_state(state))
            if state is TrialState.COMPLETE and (
                    self.best_kept is None or self.plan.mode.better(record.value, self.best_kept[1])):
                self.best_kept = (record.number, record.value, result)  # only the best is kept in memory
            if state is TrialState.FAILED:
                self.failed.append(record)
                if len(self.failed) >= self.plan.max_failed:
                    self.stop.set(StopReason.FAILED)
            record.state = state  # last: a stopped sweep returns once every record is terminal
        self.board.changed(record)

    def records(self) -> list[TrialRecord]:
        return sorted(self.earlier + self.ran, key=lambda r: r.number)


def _tell_study(study, trial, value, state) -> None:
    """study.tell, except for a grid's end: Optuna's GridSampler asks the study to stop once every
    point of the grid is taken, and Study.stop raises outside study.optimize (which a sweep does
    not use). The trial is stored by then (Optuna stores it in a `finally`); the sweep's budget
    already ends at the grid's size, so that stop request is not needed."""
    import optuna

    try:
        study.tell(trial, value, state=state)
    except RuntimeError:
        if not isinstance(study.sampler, optuna.samplers.GridSampler) or not _stored_as(study, trial, state):
            raise


def _stored_as(study, trial, state) -> bool:
    return study.get_trials(deepcopy=False)[trial.number].state == state


def _optuna_state(state: TrialState):
    from optuna.trial import TrialState as OptunaState

    return {TrialState.COMPLETE: OptunaState.COMPLETE, TrialState.PRUNED: OptunaState.PRUNED}.get(
        state, OptunaState.FAIL)


def _returned_objective(result: Any, objective: str) -> float | None:
    """A function that never reported the objective may return it (a number, or a dict with it)."""
    if isinstance(result, dict):
        return objective_value(result, objective)
    return objective_value({objective: result}, objective)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]
