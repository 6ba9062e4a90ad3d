"""Detached runs, kernel's side (issue 32): list this account's runs, attach to one (its events so
far rendered on this kernel's observer, then live, then its result unpickled here), cancel one.
The gateway asked is the hub's, else this user's own (usergateway.py; never started from here).
Imports no Ray. The protocol is in hosted.py; the gateway's records in detached.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..errors import GPUSessionError
from ..observe.events import Observer, RunInfo
from .client import connect
from .frames import Connection
from .remote import _follow
from .runwire import error_from_json
from .usergateway import NoUserGateway, detached_gateway
from .kinds import Event, Kind


@dataclass(frozen=True)
class DetachedRecord:
    """One detached run as gs.runs(all=True) shows it (times are Unix seconds)."""

    run_id: str
    name: str
    state: str  # submitted, queued, starting, running, finished, failed, cancelled
    gpus: float
    workers: int
    started: float
    ended: float | None
    expires: float  # when the gateway drops its records (result, metrics, output, receipt)
    end_reason: str | None
    max_duration: float
    reports: int
    notebook: str | None = None  # the notebook that submitted it, when its kernel knew
    dropped: int = 0  # its reports and output lines the gateway no longer keeps (the oldest; keeping.History)

    @classmethod
    def from_row(cls, row: dict) -> "DetachedRecord":
        return cls(str(row["run_id"]), str(row["name"]), str(row["state"]), float(row["gpus"]), int(row["workers"]),
                   float(row["started"]), None if row.get("ended") is None else float(row["ended"]),
                   float(row["expires"]), row.get("end_reason"), float(row["max_duration"]), int(row.get("reports", 0)),
                   row.get("notebook") if isinstance(row.get("notebook"), str) else None, int(row.get("dropped", 0)))


def _ask(kind: Kind, answer_kind: Kind, path: str, **fields: Any) -> Any:
    conn, _ = connect("run", path)
    try:
        conn.send(kind, **fields)
        answer = conn.receive()
    finally:
        conn.close()
    if answer.kind != answer_kind:
        raise error_from_json(answer.get("error"))
    return answer


def list_runs(address: str | None = None) -> list[DetachedRecord]:
    """This account's detached runs the gateway keeps, newest first (none when no gateway of this
    user runs outside the hub: it keeps nothing then). `address`: the cluster's, where this process
    knows it otherwise than by RAY_ADDRESS (a Jupyter server asks for its kernels')."""
    try:
        path = detached_gateway("gs.runs(all=True)", address=address)
    except NoUserGateway:
        return []
    return [DetachedRecord.from_row(row) for row in _ask(Kind.LIST, Kind.RUNS, path).get("runs") or []]


def cancel_run(run_id: str, address: str | None = None) -> bool:
    """Ask the gateway to stop a detached run; False when it had already ended."""
    path = detached_gateway(f"cancelling the detached run {str(run_id)[:40]}", address=address)
    return not _ask(Kind.CANCEL, Kind.CANCELLING, path, run_id=str(run_id)).get("ended")


def open_attach(run_id: str) -> tuple[Connection, str, DetachedRecord]:
    """The connection following the run, once the gateway said it is this account's (or the
    error it gave: an unknown id, another account's run)."""
    path = detached_gateway(f"gs.attach({str(run_id)[:40]!r})")
    conn, _ = connect("run", path)
    try:
        conn.send(Kind.ATTACH, run_id=str(run_id))
        first = conn.receive()
    except BaseException:
        conn.close()
        raise
    if first.kind != Kind.EVENT or first.get("event") != Event.ATTACHED:
        conn.close()
        raise error_from_json(first.get("error"))
    return conn, path, DetachedRecord.from_row(first.get("run") or {})


def follow_attached(conn: Connection, path: str, record: DetachedRecord, info: RunInfo, observer: Observer,
                    on_note: Callable[[dict], None] | None = None) -> Any:
    """The run's events so far, then live, rendered on `observer`; its value (or its error)."""
    observer.requesting(record.gpus, record.workers)
    try:
        return _follow(conn, path, info, observer, on_note)
    finally:
        conn.close()
