"""PURE: what the trials table, the one-line summary and the plots contain."""
from __future__ import annotations

import html
import io
from typing import Callable, Iterable

from .records import TrialRecord, TrialState

STATE_MARKS = {
    TrialState.QUEUED: "⏳ queued", TrialState.STARTING: "… starting", TrialState.RUNNING: "▶ running",
    TrialState.REQUEUED: "↻ preempted, queued", TrialState.COMPLETE: "✓ complete",
    TrialState.PRUNED: "✂ pruned", TrialState.FAILED: "✗ failed", TrialState.INTERRUPTED: "■ stopped",
}


def sort_key(mode_min: bool) -> Callable[[TrialRecord], tuple]:
    """Best objective first (the trial's value: its last report, as Optuna ranks complete trials),
    trials with none yet last, then by number."""
    def key(record: TrialRecord) -> tuple:
        if record.value is None:
            return (1, 0.0, record.number)
        return (0, record.value if mode_min else -record.value, record.number)

    return key


def sorted_records(records: Iterable[TrialRecord], *, mode_min: bool) -> list[TrialRecord]:
    return sorted(records, key=sort_key(mode_min))


def _fmt(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def table_rows(records: Iterable[TrialRecord], *, objective: str, mode_min: bool) -> tuple[list[str], list[list[str]]]:
    """(columns, rows) of the trials table, sorted by objective."""
    ordered = sorted_records(records, mode_min=mode_min)
    names: list[str] = []
    for record in ordered:
        names.extend(name for name in record.params if name not in names)
    columns = ["trial", *names, f"last {objective}", f"best {objective}", "step", "state", "GPU·s"]
    rows = []
    for record in ordered:
        state = STATE_MARKS[record.state]
        if record.preemptions and record.state is not TrialState.REQUEUED:
            state += f" ({record.preemptions}× preempted)"
        rows.append([str(record.number), *(_fmt(record.params.get(n)) for n in names), _fmt(record.value),
                     _fmt(record.best), _fmt(record.step), state, f"{record.gpu_seconds:.1f}"])
    return columns, rows


def summary_line(records: Iterable[TrialRecord], *, budget: int, objective: str, mode_min: bool) -> str:
    records = list(records)
    counts = {state: sum(1 for r in records if r.state is state) for state in TrialState}
    active = counts[TrialState.RUNNING] + counts[TrialState.STARTING]
    waiting = counts[TrialState.QUEUED] + counts[TrialState.REQUEUED]
    done = sum(1 for r in records if r.state.counts)
    parts = [f"{done}/{budget} trials done", f"{active} running", f"{waiting} waiting for GPUs"]
    for state in (TrialState.PRUNED, TrialState.FAILED, TrialState.INTERRUPTED):
        if counts[state]:
            parts.append(f"{counts[state]} {state.value}")
    complete = [r for r in records if r.state is TrialState.COMPLETE and r.value is not None]
    if complete:
        best = min(complete, key=lambda r: r.value if mode_min else -r.value)
        parts.append(f"best {objective} {best.value:.4g} (trial {best.number})")
    gpu_s = sum(r.gpu_seconds for r in records if r.ran_here)
    parts.append(f"{gpu_s:.1f} GPU·s")
    return " · ".join(parts)


def table_text(columns: list[str], rows: list[list[str]]) -> str:
    width = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(columns)]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(row, width)) for row in [columns, *rows])


def table_html(columns: list[str], rows: list[list[str]], summary: str) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>" for row in rows)
    return (f"<div style='font-size:smaller;opacity:0.8'>{html.escape(summary)}</div>"
            f"<table class='gpusession-trials'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")


def plot_png(records: list[TrialRecord], *, objective: str, mode_min: bool) -> bytes | None:
    """Two panels: each trial's final objective by trial number, and every trial's curve
    (the best trial's drawn bold, pruned ones faint)."""
    with_curves = [r for r in records if r.curve]
    if not with_curves:
        return None
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(9.0, 2.8), dpi=80, layout="constrained")
    FigureCanvasAgg(figure)
    by_trial, curves = figure.add_subplot(1, 2, 1), figure.add_subplot(1, 2, 2)
    colours = {TrialState.COMPLETE: "tab:blue", TrialState.PRUNED: "tab:gray", TrialState.FAILED: "tab:red"}
    for record in with_curves:
        colour = colours.get(record.state, "tab:orange")
        by_trial.scatter([record.number], [record.value], color=colour, s=18)
    ordered = sorted_records(with_curves, mode_min=mode_min)
    best = next((r for r in ordered if r.state is TrialState.COMPLETE), None)
    for record in with_curves:
        steps, values = zip(*record.curve)
        faint = record.state in (TrialState.PRUNED, TrialState.FAILED, TrialState.INTERRUPTED)
        curves.plot(steps, values, linewidth=2.2 if record is best else 1.0, alpha=0.35 if faint else 0.9,
                    label=f"trial {record.number} (best)" if record is best else None)
    by_trial.set_title(f"{objective} by trial (blue complete, grey pruned)")
    by_trial.set_xlabel("trial")
    curves.set_title(f"{objective} per step")
    curves.set_xlabel("step")
    if best is not None:
        curves.legend(fontsize="small")
    for axes in (by_trial, curves):
        axes.grid(alpha=0.3)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()
