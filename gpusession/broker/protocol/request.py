"""PURE: the one lease request model and the checks of every value a caller sends the broker.

The client builds a `LeaseRequest` (so a typo in a notebook fails in the notebook), the broker
parses the same dict again at its door (so a caller that skips the client is held to the same
rules), and the REST layer reads lease ids and usage ranges with the helpers here. A refused
value raises `InvalidRequest` naming the field and the allowed range; nothing is written.
"""
from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, fields
from numbers import Integral, Real
from typing import Any, Mapping, Sequence

from ...errors import InvalidRequest
from ..policy.model import NodeCapacity, Placement, Priority

PROTOCOL = 4  # the broker's calling convention; 2: lease methods take auth=..., release takes no time;
#              3: relocate/relocated (a run that lost a host moves its share), grants name lost hosts;
#              4: requests name their notebook and cell and say whether a background run asked,
#                 `progress` carries a run's live step
MIN_GPUS_PER_WORKER = 0.01  # below this a "GPU share" is a typo (1e-9), not a plan
MAX_WORKERS = 10_000  # far beyond any cluster; keeps the policy's loops bounded
MAX_SECONDS = 10 * 366 * 86400.0  # timeouts and holds: finite and at most ten years
MAX_POLL_S = 60.0  # one long poll (wait) parks at most this long
_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
_NAME = re.compile(r"^[^\x00-\x1f\x7f]{1,256}$")  # user names: printable, bounded
_REASON = re.compile(r"^[a-z][a-z _-]{0,39}$")  # "finished", "caller exited", ...
_JOB = re.compile(r"^[0-9a-fA-F]{1,64}$")
_NOTEBOOK = re.compile(r"^[^\x00-\x1f\x7f]{1,512}$")  # a notebook's path in its server: printable, bounded
NOTEBOOK_ALLOWED = "None or a notebook path of 1-512 printable characters"
CELL_ALLOWED = "None or a notebook cell id of 1-64 characters from A-Z a-z 0-9 . _ -"


def _refuse(field: str, allowed: str, value: Any) -> InvalidRequest:
    return InvalidRequest(f"{field} must be {allowed}; got {_short(value)}. Nothing was changed.")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def whole(value: Any, field: str, *, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral) or not low <= value <= high:
        raise _refuse(field, f"a whole number from {low} to {high}", value)
    return int(value)


def number(value: Any, field: str, *, low: float, high: float, allowed: str | None = None) -> float:
    """A finite real in [low, high]; bools, strings, NaN and infinities are refused."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise _refuse(field, allowed or f"a number from {low:g} to {high:g}", value)
    result = float(value)
    if not (math.isfinite(result) and low <= result <= high):
        raise _refuse(field, allowed or f"a number from {low:g} to {high:g}", value)
    return result


def flag(value: Any, field: str) -> bool:
    """True or False only: 1, "yes" and None are refused (a label must not guess)."""
    if not isinstance(value, bool):
        raise _refuse(field, "True or False", value)
    return value


def seconds(value: Any, field: str, *, high: float = MAX_SECONDS) -> float | None:
    if value is None:
        return None
    result = number(value, field, low=0.0, high=high,
                    allowed=f"None (no limit) or seconds, more than 0 and at most {high:g}")
    if result <= 0:
        raise _refuse(field, f"None (no limit) or seconds, more than 0 and at most {high:g}", value)
    return result


def text(value: Any, field: str, pattern: re.Pattern, allowed: str, *, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str) or not pattern.match(value):
        raise _refuse(field, allowed, value)
    return value


def lease_id(value: Any) -> int:
    """A lease id as the broker's methods take it."""
    return whole(value, "lease_id", low=1, high=2**62)


def release_reason(value: Any) -> str:
    return text(value, "reason", _REASON, "a short lower-case word such as 'finished'")


def poll_seconds(value: Any) -> float:
    return number(value, "timeout_s", low=0.0, high=MAX_POLL_S)


@dataclass(frozen=True)
class LeaseRequest:
    """What a kernel asks the broker for; `parse` is the only way in from outside."""

    request_id: str
    user: str
    workers: int
    gpus_per_worker: float
    signature: str | None = None
    job_id: str | None = None
    min_workers: int | None = None
    priority: Priority = Priority.NORMAL
    placement: Placement = Placement.PACK
    max_hold_s: float | None = None
    queue_timeout_s: float | None = None
    sweep_id: str | None = None  # trials of one sweep share it (lease views and the admin page group by it)
    notebook: str | None = None  # the notebook the request comes from (JupyterLab's sidebar opens it)
    cell_id: str | None = None  # the notebook cell that asked (nbformat cell id: the sidebar selects it)
    background: bool = False  # asked by a background run (train.submit, %%gpu --bg): the sidebar says so

    @property
    def gpus(self) -> float:
        return self.workers * self.gpus_per_worker

    @classmethod
    def parse(cls, spec: Any) -> "LeaseRequest":
        """Check every field of a request dict; InvalidRequest names the first bad one."""
        if not isinstance(spec, Mapping):
            raise InvalidRequest(f"A lease request must be a dict of fields; got {type(spec).__name__}.")
        unknown = sorted(str(k) for k in spec if k not in FIELD_NAMES)
        if unknown:
            raise InvalidRequest(f"Unknown request field {unknown[0]!r}; the fields are {', '.join(FIELD_NAMES)}. "
                                 "Nothing was changed.")
        for name in ("request_id", "user", "workers", "gpus_per_worker"):
            if spec.get(name) is None:
                raise InvalidRequest(f"The request has no {name}; it is required. Nothing was changed.")
        gpw = number(spec["gpus_per_worker"], "gpus_per_worker", low=MIN_GPUS_PER_WORKER, high=float(MAX_WORKERS),
                     allowed=f"a number of GPUs from {MIN_GPUS_PER_WORKER:g} up to what one node has")
        if gpw > 1 and gpw != int(gpw):
            raise _refuse("gpus_per_worker", "a fraction of one GPU (e.g. 0.5) or a whole number", spec["gpus_per_worker"])
        workers = whole(spec["workers"], "workers", low=1, high=MAX_WORKERS)
        minimum = spec.get("min_workers")
        return cls(
            request_id=text(spec["request_id"], "request_id", _ID, "1-64 characters from A-Z a-z 0-9 . _ -"),
            user=text(spec["user"], "user", _NAME, "a user name of 1-256 printable characters"),
            workers=workers,
            gpus_per_worker=gpw,
            signature=text(spec.get("signature"), "signature", _NAME, "None or the server's signature",
                           optional=True),
            job_id=text(spec.get("job_id"), "job_id", _JOB, "None or a Ray job id (hex)", optional=True),
            min_workers=None if minimum is None else whole(minimum, "min_workers", low=1, high=workers),
            priority=_choice(Priority.parse, spec.get("priority", "normal"), "priority"),
            placement=_choice(Placement.parse, spec.get("placement", "pack"), "placement"),
            max_hold_s=seconds(spec.get("max_hold_s"), "max_hold_s"),
            queue_timeout_s=seconds(spec.get("queue_timeout_s"), "queue_timeout_s"),
            sweep_id=text(spec.get("sweep_id"), "sweep_id", _ID, "None or 1-64 characters from A-Z a-z 0-9 . _ -",
                          optional=True),
            notebook=text(spec.get("notebook"), "notebook", _NOTEBOOK, NOTEBOOK_ALLOWED, optional=True),
            cell_id=text(spec.get("cell_id"), "cell_id", _ID, CELL_ALLOWED, optional=True),
            background=flag(spec.get("background", False), "background"),
        )

    def check_fits(self, nodes: Sequence[NodeCapacity]) -> None:
        """GPUs per worker must fit on one node of the cluster as it is (when it has GPU nodes)."""
        largest = max((node.gpus for node in nodes), default=0.0)
        if largest > 0 and self.gpus_per_worker > largest + 1e-9:
            raise InvalidRequest(
                f"gpus_per_worker must be from {MIN_GPUS_PER_WORKER:g} to {largest:g} (the most GPUs one node "
                f"of this cluster has); got {self.gpus_per_worker:g}. Ask for more workers with fewer GPUs each. "
                "Nothing was changed."
            )

    def to_dict(self) -> dict:
        """The wire form: plain values, so clients and brokers of other versions can read it."""
        data = asdict(self)
        data["priority"], data["placement"] = self.priority.label, self.placement.value
        return data


FIELD_NAMES = tuple(f.name for f in fields(LeaseRequest))


def notebook_label(value: Any) -> str | None:
    """The notebook a kernel's request names (gpusession.run.caller.kernelcell) when that is a valid label,
    else None (a strange path never fails the user's run: the label is only shown)."""
    return value if isinstance(value, str) and _NOTEBOOK.match(value) else None


def cell_label(value: Any) -> str | None:
    """The cell a kernel's request names (JupyterLab's cellId), when valid; else None."""
    return value if isinstance(value, str) and _ID.match(value) else None


def _choice(parse, value: Any, field: str):
    try:
        return parse(value, field_name=field)
    except (ValueError, TypeError) as exc:
        raise InvalidRequest(f"{exc} Nothing was changed.") from None


def node_workers(value: Any, *, workers: int) -> dict[str, int]:
    """Workers per node as `placed` reports them: node ids to positive counts summing to `workers`."""
    if not isinstance(value, Mapping) or len(value) > workers:
        raise _refuse("node_workers", f"a dict of node id -> workers (at most {workers} nodes)", value)
    out: dict[str, int] = {}
    for node, count in value.items():
        text(node, "node_workers", _ID_NODE, "a dict whose keys are Ray node ids")
        out[node] = whole(count, f"node_workers[{node[:12]}...]", low=1, high=workers)
    if sum(out.values()) != workers:
        raise _refuse("node_workers", f"counts summing to the lease's {workers} workers", value)
    return out


def node_ids(value: Any, field: str, *, most: int) -> list[str]:
    """A list of 1 to `most` distinct Ray node ids (hex strings)."""
    allowed = f"a list of 1 to {most} distinct Ray node ids"
    if not isinstance(value, (list, tuple)) or not 1 <= len(value) <= most or len(set(map(repr, value))) != len(value):
        raise _refuse(field, allowed, value)
    for node in value:
        text(node, field, _ID_NODE, allowed)
    return [str(node) for node in value]


_ID_NODE = re.compile(r"^[0-9a-fA-F]{1,128}$")


def usage_range(since: Any, until: Any, *, now: float, earliest: float | None) -> tuple[float, float]:
    """A usage query's range, bounded: nothing is counted before the ledger's first grant or after
    now, so 1970 to 9999 costs what the ledger holds, not 8,000 years of days."""
    end = now if until is None else number(until, "until", low=0.0, high=1e13, allowed="Unix seconds >= 0")
    start = end - 7 * 86400.0 if since is None else number(since, "since", low=0.0, high=1e13,
                                                           allowed="Unix seconds >= 0")
    if start > end:
        raise InvalidRequest(f"since ({start:.0f}) is after until ({end:.0f}); swap them.")
    end = min(end, now)
    start = max(start, earliest if earliest is not None else end)
    return start, max(start, end)


USAGE_GROUPINGS = ("user", "day")


def grouping(value: Any) -> str:
    if value not in USAGE_GROUPINGS:
        raise _refuse("by", "'user' or 'day'", value)
    return value
