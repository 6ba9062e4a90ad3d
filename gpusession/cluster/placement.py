"""A Ray placement group's state, as Ray reports it: Ray plumbing, read by the broker's view of
Ray, the caller's bundles and a node's worker."""
from __future__ import annotations

import enum


class PlacementState(str, enum.Enum):
    """A Ray placement group's state, as `ray.util.placement_group_table` reports it (parsed
    where it is read: `rayview`, the rank's watchdog, the group's removal)."""
    PENDING = "PENDING"
    PREPARED = "PREPARED"
    CREATED = "CREATED"
    REMOVED = "REMOVED"
    RESCHEDULING = "RESCHEDULING"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls, value: object) -> PlacementState:
        """The member named `value`; anything else is a ValueError naming the field."""
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"a placement group whose 'state' is {str(value)[:40]!r}, not one of "
                             f"{', '.join(s.value for s in cls)}") from None
