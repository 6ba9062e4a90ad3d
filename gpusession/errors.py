"""The errors gpusession raises. Each message says what happened, the numbers, and what to do."""
from __future__ import annotations

import enum


class GPUSessionError(Exception):
    """Base class of every gpusession error."""


class QuotaExceeded(GPUSessionError):
    """The request is beyond the user's quota: priority, GPU-hour budget, or live detached runs."""


class Infeasible(GPUSessionError):
    """The request can never be placed: more GPUs than the cluster (or the user's ceiling) allows."""


class QueueTimeout(GPUSessionError):
    """No GPUs were granted within queue_timeout; nothing was leased."""


class LeaseRevoked(GPUSessionError):
    """The lease was revoked by its owner or an admin; the workers were stopped."""


class Preempted(GPUSessionError):
    """The lease was preempted for a more entitled request; the run stopped at its last checkpoint."""


class RunTimeout(GPUSessionError):
    """The run exceeded its timeout; the workers were stopped and the GPUs released."""


class RunCancelled(GPUSessionError):
    """A background run was stopped with run.cancel(); its workers were stopped and its GPUs released."""


class LaunchRefused(GPUSessionError):
    """A node's launcher would not start a rank as the caller's account; the message names user, node and why."""


class NotAuthorized(GPUSessionError):
    """The caller may not do this: an admin token or the lease's owner is required."""


class LeaseNotFound(GPUSessionError):
    """No lease with that id exists in the broker's ledger."""


class InvalidRequest(GPUSessionError, ValueError):
    """A value sent to the broker is out of range or of the wrong kind; nothing was changed."""


class BrokerOutdated(GPUSessionError):
    """The running broker speaks an older protocol and only an admin (the admin token) may upgrade it."""


class BrokerFailed(GPUSessionError):
    """The broker failed on a call for a reason of its own; its log on the head node has the cause."""


class WorkerFailed(GPUSessionError):
    """A worker raised or died; every worker was stopped and the GPUs released."""

    def __init__(
        self,
        message: str,
        *,
        rank: int | None = None,
        node: str | None = None,
        remote_type: str | None = None,
        remote_message: str | None = None,
        remote_traceback: str | None = None,
    ) -> None:
        super().__init__(message)
        self.rank = rank
        self.node = node
        self.remote_type = remote_type
        self.remote_message = remote_message
        self.remote_traceback = remote_traceback

    def __reduce__(self):
        kwargs = dict(
            rank=self.rank,
            node=self.node,
            remote_type=self.remote_type,
            remote_message=self.remote_message,
            remote_traceback=self.remote_traceback,
        )
        return (_rebuild_worker_failed, (self.args[0], kwargs, type(self)))

    def __str__(self) -> str:
        text = self.args[0]
        if self.remote_traceback:
            text += "\n\nRemote traceback (rank %s on %s):\n%s" % (
                self.rank,
                self.node,
                self.remote_traceback.rstrip(),
            )
        return text


class ResultTooLarge(WorkerFailed):
    """A rank's result or checkpoint did not fit in its node's object store, or a detached run's result in its keep."""


def _rebuild_worker_failed(message: str, kwargs: dict, cls: type = WorkerFailed) -> WorkerFailed:
    return cls(message, **kwargs)


class CallFailure(str, enum.Enum):
    """The typed errors of a broker call that are no gpusession error of their own: the broker
    could not be reached (Unavailable), or it failed for a reason of its own (BrokerFailed)."""
    UNAVAILABLE = "Unavailable"
    BROKER_FAILED = "BrokerFailed"

    def __str__(self) -> str:  # "Unavailable" in messages, like the plain value
        return self.value


ERRORS_BY_NAME = {
    cls.__name__: cls
    for cls in (
        QuotaExceeded,
        Infeasible,
        QueueTimeout,
        LeaseRevoked,
        Preempted,
        RunTimeout,
        RunCancelled,
        NotAuthorized,
        LeaseNotFound,
        WorkerFailed,
        ResultTooLarge,
        LaunchRefused,
        InvalidRequest,
        BrokerOutdated,
        BrokerFailed,
    )
}
