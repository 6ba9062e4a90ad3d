"""PURE: the one status line on top of a run's output, as text and HTML (SPEC section 3).

A run is always in one phase: asking (before the broker answers: connecting to Ray can take
seconds on a first call), queued, starting its workers, running, changing course (a restart
or resize), or done. `Status` is that phase as a value; `status_text` turns it and the clock
into the line, so the line keeps its elapsed seconds ticking while no event comes (workers can
take 3-12 s to start on a first call with nothing to say in between). No emoji: the line must
read the same in a terminal and in a browser without an emoji font.
"""
from __future__ import annotations

import html
from dataclasses import dataclass, field, replace
from enum import Enum

BORROWED = "on borrowed GPUs (over your quota): preempted first if their owner needs them"


class Phase(Enum):
    ASKING = "asking"
    QUEUED = "queued"
    STARTING = "starting"
    RUNNING = "running"
    CHANGING = "changing"  # a restart or resize told by the run controller
    DONE = "done"

    @property
    def is_terminal(self) -> bool:
        return self is Phase.DONE


@dataclass(frozen=True)
class Status:
    phase: Phase
    since: float  # clock time the phase began; elapsed seconds count from it
    gpus: float = 0.0
    workers: int = 0
    nodes: int = 0
    borrowed: bool = False
    view: dict = field(default_factory=dict)  # the broker's queue view while queued
    step: object = None  # the last reported step (or report count) while running
    line: str = ""  # the controller's own words while changing; the receipt when done
    failed: bool = False
    stopped: bool = False  # done because its user stopped it (interrupted, cancelled): not failed

    def moved(self, phase: Phase, now: float, **changes) -> "Status":
        return replace(self, phase=phase, since=now, **changes)


def _plural(count: float, word: str) -> str:
    return f"{count:g} {word}{'' if count == 1 else 's'}"


def queue_text(view: dict, elapsed_s: float | None) -> str:
    gpus = view.get("gpus") or 0
    position = view.get("position")
    where = f"position {position} in the queue" if position else "in the queue"
    why = view.get("reason") or "waiting"
    seconds = "" if elapsed_s is None else f" · {max(0.0, elapsed_s):.0f} s"
    return f"waiting for {_plural(gpus, 'GPU')} · {where} · {why}{seconds}"


def status_text(status: Status, now: float | None) -> str:
    """The line as it reads at clock time `now`; now=None leaves the seconds out (a terminal
    prints one line per change instead of redrawing)."""
    seconds = "" if now is None else f"{max(0.0, now - status.since):.0f} s"
    dot, paren = (f" · {seconds}", f" ({seconds})") if seconds else ("", "")
    phase = status.phase
    if phase is Phase.ASKING:
        text = f"asking the cluster for {_plural(status.gpus, 'GPU')}{dot}"
    elif phase is Phase.QUEUED:
        text = queue_text({"gpus": status.gpus, **status.view}, None if now is None else now - status.since)
    elif phase is Phase.STARTING:
        text = f"starting {_plural(status.workers, 'worker')} on {_plural(status.nodes or 1, 'node')}{paren}"
    elif phase is Phase.RUNNING:
        step = f" · step {status.step}" if status.step is not None else ""
        text = f"running on {_plural(status.gpus, 'GPU')}{step}{dot}"
    elif phase is Phase.CHANGING:
        text = f"{status.line}{paren}"
    else:
        return status.line  # the receipt says borrowed itself
    return f"{text} · {BORROWED}" if status.borrowed else text


def status_html(status: Status, now: float) -> str:
    """The line for a notebook: a small coloured tag for the phase, then the text."""
    tag, colour = _TAGS[status.phase]
    if status.phase is Phase.CHANGING and "restarting" not in (status.line or ""):
        tag = "resizing"  # an elastic run changing size ("... 4 -> 2 GPUs from the checkpoint after step 340")
    if status.phase.is_terminal and status.failed:
        tag, colour = "failed", "#c62828"
    elif status.phase.is_terminal and status.stopped:
        tag, colour = "stopped", "#ef6c00"
    style = ("display:inline-block;min-width:5.5em;padding:0 0.4em;margin-right:0.5em;border-radius:3px;"
             f"color:#fff;background:{colour};font-size:0.85em;text-align:center")
    warn = " style='color:#b26a00'" if status.borrowed and not status.phase.is_terminal else ""
    return (f"<div class='gpusession-status' data-phase='{status.phase.value}'"
            " style='font-family:var(--jp-ui-font-family,sans-serif);padding:2px 0'>"
            f"<span style='{style}'>{tag}</span><span class='gpusession-status-text'{warn}>"
            f"{html.escape(_without_outcome(status, status_text(status, now)))}</span></div>")


def _without_outcome(status: Status, text: str) -> str:
    """The receipt's leading "done · " / "failed: " is what the tag already says."""
    if status.phase.is_terminal:
        for prefix in ("done · ", "failed: "):
            if text.startswith(prefix):
                return text[len(prefix):]
    return text


_TAGS = {
    Phase.ASKING: ("asking", "#546e7a"),
    Phase.QUEUED: ("queued", "#6d4c41"),
    Phase.STARTING: ("starting", "#1565c0"),
    Phase.RUNNING: ("running", "#2e7d32"),
    Phase.CHANGING: ("restarting", "#ef6c00"),
    Phase.DONE: ("done", "#455a64"),
}


def step_of(history: list[dict]):
    """What "step" the running line shows: the last report's `step`, else how many reports came."""
    if not history:
        return None
    last = history[-1].get("step")
    return last if isinstance(last, (int, float)) and not isinstance(last, bool) else len(history)
