"""PURE: the states of a lease and the only transitions allowed between them.

The books check a change against TRANSITIONS before making it, and the ledger's UPDATEs only
touch rows in a state that may go to the new one (`sources`), so a retried or racing call (a
release after reconciliation closed the lease) changes nothing instead of rewriting history.
"""
from __future__ import annotations

import enum


class LeaseState(str, enum.Enum):
    QUEUED = "queued"
    GRANTED = "granted"  # the policy gave it GPUs; Ray has not placed its group yet
    PLACED = "placed"
    ENDED = "ended"

    @property
    def is_terminal(self) -> bool:
        return self is LeaseState.ENDED

    @property
    def holds_gpus(self) -> bool:
        return self in (LeaseState.GRANTED, LeaseState.PLACED)

    def __str__(self) -> str:  # "queued" in messages and f-strings, like the plain value
        return self.value


TRANSITIONS: dict[LeaseState, frozenset[LeaseState]] = {
    LeaseState.QUEUED: frozenset({LeaseState.GRANTED, LeaseState.ENDED}),
    LeaseState.GRANTED: frozenset({LeaseState.PLACED, LeaseState.ENDED}),
    LeaseState.PLACED: frozenset({LeaseState.ENDED}),
    LeaseState.ENDED: frozenset(),
}

OPEN_STATES = tuple(s.value for s in LeaseState if not s.is_terminal)
ACTIVE_STATES = tuple(s.value for s in LeaseState if s.holds_gpus)




class IllegalTransition(ValueError):
    """A change of state that TRANSITIONS does not allow."""


def may_move(old: str, new: LeaseState) -> bool:
    return new in TRANSITIONS[LeaseState(old)]


def check_move(lease_id: int, old: str, new: LeaseState) -> None:
    if not may_move(old, new):
        raise IllegalTransition(f"Lease {lease_id} cannot go from {LeaseState(old).value} to {new.value}.")


def sources(new: LeaseState) -> tuple[str, ...]:
    """The states from which a lease may move to `new` (for the ledger's guarded UPDATEs)."""
    return tuple(old.value for old, targets in TRANSITIONS.items() if new in targets)
