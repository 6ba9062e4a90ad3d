"""PURE: how a finished run presents itself: the one-line receipt, and RunInfo's own text and
HTML (a short receipt, where the ranks ran, each restart and resize, then the reports as a
summarised table: first and last rows, numbers rounded). The full history stays in
`RunInfo.history`; only its presentation is summarised."""
from __future__ import annotations

import html
from typing import Any

from ..errors import RunCancelled

HEAD_ROWS, TAIL_ROWS = 3, 4  # a history longer than both shows its first and last rows only
RETURNED_SHOWN_FROM = 1 << 20  # a result this big is worth a word in the receipt


def format_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def costs(info, *, hosts: bool = True) -> str:
    """GPUs, times, GPU-seconds, restarts, resizes and steps lost, borrowed, where the ranks ran
    (only when on several hosts: a one-host receipt stays short), held or released."""
    kind = " logical" if info.logical_gpus else ""
    parts = [f"{info.gpus:g}{kind} GPU{'s' if info.gpus != 1 else ''}", f"queued {info.queued_s:.1f} s",
             f"setup {info.setup_s:.1f} s", f"run {info.run_s:.1f} s", f"{info.gpu_seconds:.1f} GPU·s"]
    for count, word in ((info.restarts, "restart"), (info.resizes, "resize")):
        if count:
            parts.append(f"{count} {word}{'s' if count != 1 else ''}")
    if info.steps_lost:
        parts.append(f"{info.steps_lost} step{'s' if info.steps_lost != 1 else ''} lost")
    if info.over_quota:
        parts.append("on borrowed GPUs (over quota)")
    if getattr(info, "communication", None) is not None:
        parts.append(info.communication.summary())
    if getattr(info, "shipped_bytes", 0):
        parts.append(f"shipped {info.shipped_bytes / 1e6:,.0f} MB in {info.shipped_s:.2f} s")
    if getattr(info, "returned_bytes", 0) >= RETURNED_SHOWN_FROM:
        parts.append(f"returned {info.returned_bytes / 1e6:,.0f} MB in {info.returned_s:.2f} s")
    ranks = last_ranks(info)
    if hosts and len(set(ranks.values())) > 1:
        parts.append(ranks_on_hosts(ranks))
    parts.append("released" if info.released else "still held")
    return " · ".join(parts)


def last_ranks(info) -> dict[int, str]:
    """rank -> "host (ip)" of the ranks the run has now: a run that shrank keeps no stale ranks."""
    return {rank: host for rank, host in info.rank_hosts.items() if not info.workers or rank < info.workers}


def ranks_on_hosts(rank_hosts: dict[int, str]) -> str:
    """Each host once, in rank order, with its ranks as ranges:
    "ranks 0-1 on host1 (10.0.0.11), 2-3 on host2 (10.0.0.12)"; "" when nothing is known."""
    by_host: dict[str, list[int]] = {}
    for rank in sorted(rank_hosts):
        by_host.setdefault(rank_hosts[rank], []).append(rank)
    groups = [f"{rank_ranges(ranks)} on {host}" for host, ranks in by_host.items()]
    if not groups:
        return ""
    word = "rank" if len(next(iter(by_host.values()))) == 1 else "ranks"
    return f"{word} " + ", ".join(groups)


def rank_ranges(ranks: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5" (no space: the groups of ranks_on_hosts are separated by ", ")."""
    spans: list[list[int]] = []
    for rank in ranks:
        if spans and rank == spans[-1][1] + 1:
            spans[-1][1] = rank
        else:
            spans.append([rank, rank])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in spans)


def stopped_by_user(error: BaseException | None) -> bool:
    """The run ended because its user stopped it (the stop button, run.cancel()): not a failure."""
    return isinstance(error, (KeyboardInterrupt, RunCancelled))


def outcome(error: BaseException | None) -> str:
    """The receipt's first word: "done"; "interrupted" or "cancelled" for a run its user stopped
    (the stop button, run.cancel()), which did not fail; else "failed: " and the error's type
    (WorkerFailed, Preempted, RunTimeout, ...), which the raised error explains."""
    if error is None:
        return "done"
    if isinstance(error, KeyboardInterrupt):
        return "interrupted"
    if isinstance(error, RunCancelled):
        return "cancelled"
    return f"failed: {type(error).__name__}"


def receipt_text(info, error: BaseException | None) -> str:
    if error is not None and not info.gpus:  # never granted: rejected, timed out or stopped in the queue
        return f"{outcome(error)} · nothing was leased"
    where = " (logical GPUs: the workers ran on the CPU)" if info.logical_gpus else ""
    return f"{outcome(error)} · {costs(info)}{where}"


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


def course(info) -> list[str]:
    """Lines under the title of RunInfo's display: where the ranks ran (also on one host: the
    display is asked for), then each restart and resize in order."""
    lines = []
    where = ranks_on_hosts(last_ranks(info))
    if where:
        lines.append(f"ran on: {where}")
    if info.transitions:
        lines.append("restarts and resizes:")
        lines += [f"  {line}" for line in info.transitions]
    return lines


def as_text(info) -> str:
    lines = [f"{run_title(info)}: {costs(info, hosts=False)}", *course(info),
             f"history: {history_note(info.history)}"]
    columns, rows = summary_rows(info.history)
    if columns:
        cells = [["#", *columns]] + [["…"] + [""] * len(columns) if row is None else [str(row[0]), *row[1]]
                                     for row in rows]
        widths = [max(len(r[i]) for r in cells) for i in range(len(columns) + 1)]
        lines += ["  " + "  ".join(c.rjust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    return "\n".join(lines)


def as_html(info) -> str:
    title = html.escape(f"{run_title(info)}: {costs(info, hosts=False)}")
    note = html.escape(f"history: {history_note(info.history)}")
    details = "".join(f"<div style='white-space:pre'>{html.escape(line)}</div>" for line in course(info))
    columns, rows = summary_rows(info.history)
    table = ""
    if columns:
        head = "".join(f"<th>{html.escape(c)}</th>" for c in ["#", *columns])
        body = "".join(
            f"<tr><td colspan='{len(columns) + 1}' style='text-align:center'>…</td></tr>" if row is None else
            "<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in [str(row[0]), *row[1]]) + "</tr>"
            for row in rows)
        table = f"<table class='gpusession-history'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
    return (f"<div class='gpusession-runinfo'><div><strong>{title}</strong></div>{details}"
            f"<div style='font-size:smaller;opacity:0.8'>{note}</div>{table}</div>")
