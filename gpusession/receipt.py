"""PURE: how a finished run presents itself: the one-line receipt, and RunInfo's own text and
HTML (a short receipt, then the reports as a summarised table: first and last rows, numbers
rounded). The full history stays in `RunInfo.history`; only its presentation is summarised."""
from __future__ import annotations

import html
from typing import Any

HEAD_ROWS, TAIL_ROWS = 3, 4  # a history longer than both shows its first and last rows only


def format_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def costs(info) -> str:
    """GPUs, times, GPU-seconds, restarts and resizes, borrowed, held or released."""
    kind = " logical" if info.logical_gpus else ""
    parts = [f"{info.gpus:g}{kind} GPU{'s' if info.gpus != 1 else ''}", f"queued {info.queued_s:.1f} s",
             f"setup {info.setup_s:.1f} s", f"run {info.run_s:.1f} s", f"{info.gpu_seconds:.1f} GPU·s"]
    if info.restarts:
        parts.append(f"{info.restarts} restart{'s' if info.restarts != 1 else ''}")
    if info.resizes:
        parts.append(f"{info.resizes} resize{'s' if info.resizes != 1 else ''}")
    if info.over_quota:
        parts.append("on borrowed GPUs (over quota)")
    parts.append("released" if info.released else "still held")
    return " · ".join(parts)


def receipt_text(info, error: BaseException | None) -> str:
    if error is not None and not info.gpus:  # never granted: rejected, timed out or stopped in the queue
        return f"failed: {type(error).__name__} · nothing was leased"
    outcome = "done" if error is None else f"failed: {info.end_reason or type(error).__name__}"
    where = " (logical GPUs: the workers ran on the CPU)" if info.logical_gpus else ""
    return f"{outcome} · {costs(info)}{where}"


def summary_rows(history: list[dict]) -> tuple[list[str], list[tuple[int, list[str]] | None]]:
    """(columns, rows) where a row is (report index, formatted cells) and None marks the gap."""
    columns: list[str] = []
    for report in history:
        columns.extend(key for key in report if key not in columns)
    indexed = list(enumerate(history))
    if len(indexed) > HEAD_ROWS + TAIL_ROWS + 1:
        indexed = indexed[:HEAD_ROWS] + [None] + indexed[-TAIL_ROWS:]
    rows = [None if item is None else
            (item[0], [format_value(item[1][c]) if c in item[1] else "" for c in columns])
            for item in indexed]
    return columns, rows


def run_title(info) -> str:
    lease = f"lease {info.lease_id}" if info.lease_id is not None else "no lease"
    return f"RunInfo ({lease}, {info.end_reason or 'not finished'})"


def history_note(history: list[dict]) -> str:
    count = len(history)
    if not count:
        return "no reports"
    shown = "" if count <= HEAD_ROWS + TAIL_ROWS + 1 else f", first {HEAD_ROWS} and last {TAIL_ROWS} shown"
    return f"{count} report{'s' if count != 1 else ''}{shown}; all of them in .history"


def as_text(info) -> str:
    lines = [f"{run_title(info)}: {costs(info)}", f"history: {history_note(info.history)}"]
    columns, rows = summary_rows(info.history)
    if columns:
        cells = [["#", *columns]] + [["…"] + [""] * len(columns) if row is None else [str(row[0]), *row[1]]
                                     for row in rows]
        widths = [max(len(r[i]) for r in cells) for i in range(len(columns) + 1)]
        lines += ["  " + "  ".join(c.rjust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    return "\n".join(lines)


def as_html(info) -> str:
    title = html.escape(f"{run_title(info)}: {costs(info)}")
    note = html.escape(f"history: {history_note(info.history)}")
    columns, rows = summary_rows(info.history)
    table = ""
    if columns:
        head = "".join(f"<th>{html.escape(c)}</th>" for c in ["#", *columns])
        body = "".join(
            f"<tr><td colspan='{len(columns) + 1}' style='text-align:center'>…</td></tr>" if row is None else
            "<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in [str(row[0]), *row[1]]) + "</tr>"
            for row in rows)
        table = f"<table class='gpusession-history'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
    return (f"<div class='gpusession-runinfo'><div><strong>{title}</strong></div>"
            f"<div style='font-size:smaller;opacity:0.8'>{note}</div>{table}</div>")
