"""Render docs/speed.md's speed tables from benchmarks/results/*.json: one source of truth.

    python benchmarks/report.py                   # print the tables
    python benchmarks/report.py --write           # put them into docs/speed.md between the markers
    python benchmarks/report.py --check           # exit 1 (and show the difference) when the page differs
    python benchmarks/report.py --check --strict  # also exit 1 when any row is refused (stale, dirty, ...)

Every results file found is rendered (the format is the one in benchmarks/_results.py); a file or
a row marked "simulated" goes to its own table. A benchmark script that has no results file yet
gets a row saying since when it was not re-measured, never a figure.

Each row is judged as a maintainer would (benchmarks/_freshness.py): older than the last change to
its script or to the code its file "measures" (and the project's modules that code imports),
"+dirty", derived from newer or refused results, a missed goal with no goal_note, fewer than 5
samples a side with no samples_note. The table shows every finding in the row ("stale since
1a2b3c4: re-measure"), so `--check` keeps the page honest while rows wait for a quiet machine, and
`--check --strict` is the gate a claim must pass: it fails on any finding.
"""
from __future__ import annotations

import argparse
import difflib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _freshness import Finding, Refusal, goal_met, judge, refused_summary  # noqa: E402
from _git_facts import facts_for  # noqa: E402

HERE = Path(__file__).resolve().parent
PAGE = HERE.parent / "docs" / "speed.md"
PAGE_NAME = "docs/speed.md"
BEGIN = "<!-- speed tables: rendered by `python benchmarks/report.py --write` from benchmarks/results/*.json; do not edit -->"
END = "<!-- end of speed tables -->"
NOT_BENCHMARKS = {"report.py", "ddp_loop.py"}  # helpers; files starting with "_" are helpers too

# Scripts whose figures are older than their fair re-measurement: the page keeps only this line
# for them until their script writes a results file (the figures of that date were not taken side
# by side fairly, see issue 20, so none of them is repeated here).
NOT_REMEASURED_SINCE = "2026-11-24"
NEVER_MEASURED: set[str] = {"powersgd_loss"}  # a script written but not yet run to the end goes here

MEASURED_HEADER = ("| benchmark: what is measured | gpusession: median (min-max, n) | alternative, as configured "
                   "| alternative: median (min-max, n) | ratio (goal) | machine |\n|---|---|---|---|---|---|")
SIMULATED_HEADER = ("| simulation: what is replayed | gpusession | baseline, as configured | baseline | ratio (goal) "
                    "| machine |\n|---|---|---|---|---|---|")


def load_results(folder: Path) -> list[dict]:
    documents = []
    for path in sorted(folder.glob("*.json")):
        document = json.loads(path.read_text())
        document.setdefault("benchmark", path.stem)
        documents.append(document)
    # a script's second file (multihost-tuned) right after its first, whatever the names sort as
    return sorted(documents, key=lambda d: (script_name(d), d["benchmark"] != script_name(d), d["benchmark"]))


def figure(value, samples, unit: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    text = f"{value:.4g} {unit}".strip()
    if samples and len(samples) > 1:
        text += f" ({min(samples):.4g}-{max(samples):.4g}, n={len(samples)})"
    elif samples:
        text += " (n=1)"
    return text


def ratio_cell(row: dict) -> str:
    ratio = row.get("ratio")
    if row.get("alternative_value") == "cannot":
        shown = "cannot"
    elif ratio is None:
        shown = "-"
    else:
        shown = f"{ratio:.3g}"
    if not row.get("goal"):
        return shown
    goal = f"goal: {row['goal']}"
    if goal_met(row["goal"], row) is False:
        goal += f"; missed: {row['goal_note']}" if row.get("goal_note") else "; MISSED, unexplained"
    return f"{shown} ({goal})"


def machine_cell(machine: dict, findings: list[Finding] = ()) -> str:
    """Cores, the load average at the start and at the end (one figure when the file kept only
    the end's), the day, the commit, and what refuses the row."""
    start, end = _load(machine.get("loadavg_at_start")), _load(machine.get("loadavg"))
    load = f"load {start} at start, {end} at end" if start != "?" else f"load {end}"
    when = str(machine.get("when", "?"))[:10]
    gpus = f"{len(machine['gpus'])}x {machine['gpus'][0]}, " if machine.get("gpus") else ""
    cell = f"{gpus}{machine.get('cores', '?')} cores, {load}, {when}, {machine.get('gpusession_commit') or '?'}"
    shown = [f.mark for f in findings if f.refusal is not Refusal.GOAL_MISSED_UNEXPLAINED]  # that one is by the goal
    return cell + "".join(f"; **{mark}**" for mark in shown)


def _load(loadavg) -> str:
    if not loadavg or not isinstance(loadavg[0], (int, float)):
        return "?"
    return f"{loadavg[0]:.1f}"


def alternative_cell(row: dict, previous: dict | None) -> str:
    """The alternative and how both sides were configured; "as above" when the row before, of the
    same results file, said the same."""
    alternative = row.get("alternative") or "-"
    if row.get("configured"):
        same = previous is not None and previous.get("configured") == row["configured"]
        alternative = f"{alternative}; configured: {'as above' if same else row['configured']}"
    return alternative


def script_name(document: dict) -> str:
    """The script that wrote the file: its name, or "script" for a second file of one script
    (multihost-tuned.json, written by multihost.py with Ray's health check tuned)."""
    return document.get("script") or document["benchmark"]


def _notes(row: dict) -> str:
    """The row's note and, where a side has few samples, why (samples_note)."""
    notes = [row[key] for key in ("note", "samples_note") if row.get(key)]
    return "".join(f" ({note})" for note in notes)


def measured_line(document: dict, row: dict, previous: dict | None = None, findings: list[Finding] = ()) -> str:
    unit = row.get("unit", "")
    what = f"`{script_name(document)}.py`: {row['measure']}"
    alternative = alternative_cell(row, previous)
    what += _notes(row)
    return "| " + " | ".join([
        what, figure(row.get("gpusession"), row.get("gpusession_samples"), unit), alternative,
        figure(row.get("alternative_value"), row.get("alternative_samples"), unit), ratio_cell(row),
        machine_cell(row.get("machine") or document.get("machine", {}), findings)]) + " |"


def simulated_line(document: dict, row: dict, previous: dict | None = None, findings: list[Finding] = ()) -> str:
    unit = row.get("unit", "")
    what = f"`{script_name(document)}.py`: {row['measure']}"
    what += _notes(row)
    alternative = alternative_cell(row, previous)
    return "| " + " | ".join([
        what, figure(row.get("gpusession"), _spread(row.get("gpusession_samples")), unit), alternative,
        figure(row.get("alternative_value"), _spread(row.get("alternative_samples")), unit), ratio_cell(row),
        machine_cell(row.get("machine") or document.get("machine", {}), findings)]) + " |"


def _spread(samples) -> list | None:
    """A simulation's samples only when it repeated (one seed is one figure, not "n=1")."""
    return samples if samples and len(samples) > 1 else None


def is_simulated(document: dict, row: dict) -> bool:
    """A file marked simulated, or one row of a measured file (background.py's steps are sleeps)."""
    return bool(document.get("simulated") or row.get("simulated"))


def document_lines(document: dict, line, simulated: bool, facts: dict | None = None) -> list[str]:
    """The file's rows that belong in the table (simulated or not), each with its findings."""
    rows = document.get("rows", [])
    lines = []
    for i, row in enumerate(rows):
        if is_simulated(document, row) != simulated:
            continue
        found = judge(row, facts[(document["benchmark"], i)]) if facts is not None else []
        lines.append(line(document, row, rows[i - 1] if i else None, found))
    return lines


def findings_by_row(documents: list[dict], facts: dict) -> list[tuple[str, list[Finding]]]:
    """Each row's name ('benchmark: measure', and its alternative when it has one: a measure set
    against two alternatives is two rows) with what refuses it (empty: it stands)."""
    return [(row_name(d, row), judge(row, facts[(d["benchmark"], i)]))
            for d in documents for i, row in enumerate(d.get("rows", []))]


def row_name(document: dict, row: dict) -> str:
    name = f"{document['benchmark']}: {row['measure']}"
    return f"{name} (against {row['alternative']})" if row.get("alternative") else name


def benchmark_scripts(folder: Path) -> list[str]:
    return sorted(p.stem for p in folder.glob("*.py") if not p.name.startswith("_") and p.name not in NOT_BENCHMARKS)


def render(documents: list[dict], scripts: list[str], facts: dict | None = None) -> str:
    """The tables; with FACTS (benchmarks/_git_facts.py's facts_for), each row shows what refuses it."""
    lines = ["Measured side by side (each row from `benchmarks/results/NAME.json`, written by `benchmarks/NAME.py`):",
             "", MEASURED_HEADER]
    lines += [line for d in documents for line in document_lines(d, measured_line, False, facts)]
    simulated = [line for d in documents for line in document_lines(d, simulated_line, True, facts)]
    have = {script_name(d) for d in documents}
    lines += [f"| `{name}.py` | " + ("not measured yet" if name in NEVER_MEASURED else
                                      f"not re-measured since {NOT_REMEASURED_SINCE}") + " | | | | |"
              for name in scripts if name not in have]
    if simulated:
        lines += ["", "Simulated (a virtual clock or simulated GPU time, not a measurement of either side; costs as "
                  "each row says):", "", SIMULATED_HEADER, *simulated]
    return "\n".join(lines)


def current_block(page: str) -> str | None:
    if BEGIN not in page or END not in page:
        return None
    return page.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n")


def with_block(page: str, block: str) -> str:
    head, rest = page.split(BEGIN, 1)
    return f"{head}{BEGIN}\n{block}\n{END}{rest.split(END, 1)[1]}"


def difference(page_text: str, rendered: str) -> str:
    """Empty when the page's tables are the rendered ones; else a unified diff (or what is missing)."""
    block = current_block(page_text)
    if block is None:
        return f"{PAGE_NAME} has no speed tables between the markers:\n{BEGIN}\n{END}"
    if block == rendered:
        return ""
    return "\n".join(difflib.unified_diff(block.splitlines(), rendered.splitlines(), PAGE_NAME, "rendered",
                                          lineterm=""))


def check(page_text: str, rendered: str, refused: list[str], *, strict: bool) -> tuple[int, str]:
    """The exit status and what to print: 1 when the page differs from the rendered tables, and
    with strict also when any row is refused (the table shows those rows as such either way)."""
    diff = difference(page_text, rendered)
    if diff:
        return 1, f"{PAGE_NAME}'s speed tables differ from benchmarks/results (run with --write):\n{diff}"
    lines = [f"{PAGE_NAME}'s speed tables match benchmarks/results"]
    if refused:
        verdict = "refused (--strict)" if strict else "shown as such in the table; --strict refuses them"
        lines += [f"{len(refused)} rows cannot stand as current claims ({verdict}); re-measure on a quiet machine "
                  "or explain a missed goal with goal_note, few samples with samples_note:", *(f"  {line}" for line in refused)]
    return (1 if strict and refused else 0), "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help=f"exit 1 when {PAGE_NAME}'s tables differ")
    parser.add_argument("--strict", action="store_true",
                        help="with --check: exit 1 also when a row is stale, dirty, of an unknown commit, derived "
                             "from newer or refused results, misses its goal without a goal_note, or has fewer than 5 "
                             "samples a side without a samples_note")
    parser.add_argument("--write", action="store_true", help=f"write the tables into {PAGE_NAME}")
    args = parser.parse_args(argv)
    if args.strict and not args.check:
        parser.error("--strict goes with --check")
    documents = load_results(HERE / "results")
    facts = facts_for(documents)
    rendered = render(documents, benchmark_scripts(HERE), facts)
    page = PAGE.read_text()
    if args.write:
        PAGE.write_text(with_block(page, rendered))
        print(f"wrote the speed tables into {PAGE}")
        return 0
    if args.check:
        status, text = check(page, rendered, refused_summary(findings_by_row(documents, facts)), strict=args.strict)
        print(text)
        return status
    print(rendered)
    return 0


if __name__ == "__main__":
    sys.exit(main())
