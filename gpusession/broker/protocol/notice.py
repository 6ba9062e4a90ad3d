"""A broker notice: the one `NoticeKind` the broker writes and the client reads, and the frozen
`Notice` a client parses a lease's view into once (never a dict compared with strings)."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field


class NoticeKind(str, enum.Enum):
    """What a notice tells the holder of a lease."""

    PREEMPT = "preempt"  # give every GPU back by the deadline
    REVOKE = "revoke"
    SHRINK = "shrink"  # elastic: give some workers back by the deadline, keep to_workers
    GROW = "grow"  # elastic: free GPUs are offered, take them (to_workers) by the deadline or lose the offer
    ENDED = "ended"  # client side only: the lease ended with no notice (the broker closed it)

    @property
    def is_resize(self) -> bool:
        return self in (NoticeKind.SHRINK, NoticeKind.GROW)


@dataclass(frozen=True)
class Notice:
    """What the broker told a lease's holder, as the client sees it."""

    kind: NoticeKind
    reason: str | None = None
    deadline: float | None = None
    id: str | None = None
    reason_code: str | None = None  # the end reason the broker records if it must take the lease back
    to_workers: int | None = None  # shrink and grow: the size the lease is asked to take
    to_gpus: float | None = None
    by: dict = field(default_factory=dict)  # shrink: who it is for ({"lease_id", "user", "priority"})

    @classmethod
    def parse(cls, payload: dict) -> "Notice":
        """A notice payload as the broker sends it in a lease's view."""
        return cls(kind=NoticeKind(payload["kind"]), reason=payload.get("reason"), deadline=payload.get("deadline"),
                   id=payload.get("id"), reason_code=payload.get("reason_code"),
                   to_workers=payload.get("to_workers"), to_gpus=payload.get("to_gpus"), by=payload.get("by") or {})

    @classmethod
    def from_view(cls, view: dict) -> "Notice":
        """A lease's view from `watch`: its notice, or `ENDED` with the end reason when it has none."""
        if view.get("notice"):
            return cls.parse(view["notice"])
        return cls(kind=NoticeKind.ENDED, reason=view.get("end_reason"))


def kind_of(payload: dict | None) -> NoticeKind | None:
    """The kind of a notice payload as the broker keeps it in a lease's row (None: no notice)."""
    kind = (payload or {}).get("kind")
    return NoticeKind(kind) if kind else None
