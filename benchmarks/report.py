"""Render the README's speed tables from benchmarks/results/*.json: one source of truth.

    python benchmarks/report.py            # print the tables
    python benchmarks/report.py --write    # put them into README.md between the markers
    python benchmarks/report.py --check    # exit 1 (and show the difference) when README.md differs

Every results file found is rendered (the format is the one in benchmarks/_results.py); a file
marked "simulated" goes to its own table. A benchmark script that has no results file yet gets a
row saying since when it was not re-measured, never a figure.
"""
from __future__ import annotations

import argparse
import difflib
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
README = HERE.parent / "README.md"
BEGIN = "<!-- speed tables: rendered by `python benchmarks/report.py --write` from benchmarks/results/*.json; do not edit -->"
END = "<!-- end of speed tables -->"
NOT_BENCHMARKS = {"report.py", "ddp_loop.py"}  # helpers; files starting with "_" are helpers too

# Scripts whose figures are older than their fair re-measurement: the README keeps only this line
# for them until their script writes a results file (the figures of that date were not taken side
# by side fairly, see issue 20, so none of them is repeated here).
NOT_REMEASURED_SINCE = "2026-11-24"
NEVER_MEASURED: set[str] = set()  # a script written but not yet run to the end goes here

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
    return f"{shown} (goal: {row['goal']})" if row.get("goal") else shown


def machine_cell(machine: dict) -> str:
    load = machine.get("loadavg") or ["?"]
    shown_load = f"{load[0]:.1f}" if isinstance(load[0], (int, float)) else load[0]
    when = str(machine.get("when", "?"))[:10]
    gpus = f"{len(machine['gpus'])}x {machine['gpus'][0]}, " if machine.get("gpus") else ""
    return (f"{gpus}{machine.get('cores', '?')} cores, load {shown_load}, {when}, "
            f"{machine.get('gpusession_commit') or '?'}")


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


def measured_line(document: dict, row: dict, previous: dict | None = None) -> str:
    unit = row.get("unit", "")
    what = f"`{script_name(document)}.py`: {row['measure']}"
    alternative = alternative_cell(row, previous)
    if row.get("note"):
        what += f" ({row['note']})"
    return "| " + " | ".join([
        what, figure(row.get("gpusession"), row.get("gpusession_samples"), unit), alternative,
        figure(row.get("alternative_value"), row.get("alternative_samples"), unit), ratio_cell(row),
        machine_cell(row.get("machine") or document.get("machine", {}))]) + " |"


def simulated_line(document: dict, row: dict, previous: dict | None = None) -> str:
    unit = row.get("unit", "")
    what = f"`{script_name(document)}.py`: {row['measure']}"
    alternative = alternative_cell(row, previous)
    return "| " + " | ".join([
        what, figure(row.get("gpusession"), None, unit), alternative,
        figure(row.get("alternative_value"), None, unit), ratio_cell(row),
        machine_cell(row.get("machine") or document.get("machine", {}))]) + " |"


def document_lines(document: dict, line) -> list[str]:
    rows = document.get("rows", [])
    return [line(document, row, rows[i - 1] if i else None) for i, row in enumerate(rows)]


def benchmark_scripts(folder: Path) -> list[str]:
    return sorted(p.stem for p in folder.glob("*.py") if not p.name.startswith("_") and p.name not in NOT_BENCHMARKS)


def render(documents: list[dict], scripts: list[str]) -> str:
    measured = [d for d in documents if not d.get("simulated")]
    simulated = [d for d in documents if d.get("simulated")]
    lines = ["Measured side by side (each row from `benchmarks/results/NAME.json`, written by `benchmarks/NAME.py`):",
             "", MEASURED_HEADER]
    lines += [line for d in measured for line in document_lines(d, measured_line)]
    have = {script_name(d) for d in documents}
    lines += [f"| `{name}.py` | " + ("not measured yet" if name in NEVER_MEASURED else
                                      f"not re-measured since {NOT_REMEASURED_SINCE}") + " | | | | |"
              for name in scripts if name not in have]
    if simulated:
        lines += ["", "Simulated (a virtual clock, not a measurement of either side; costs as each row says):", "",
                  SIMULATED_HEADER]
        lines += [line for d in simulated for line in document_lines(d, simulated_line)]
    return "\n".join(lines)


def current_block(readme: str) -> str | None:
    if BEGIN not in readme or END not in readme:
        return None
    return readme.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n")


def with_block(readme: str, block: str) -> str:
    head, rest = readme.split(BEGIN, 1)
    return f"{head}{BEGIN}\n{block}\n{END}{rest.split(END, 1)[1]}"


def difference(readme_text: str, rendered: str) -> str:
    """Empty when the README's tables are the rendered ones; else a unified diff (or what is missing)."""
    block = current_block(readme_text)
    if block is None:
        return f"README has no speed tables between the markers:\n{BEGIN}\n{END}"
    if block == rendered:
        return ""
    return "\n".join(difflib.unified_diff(block.splitlines(), rendered.splitlines(), "README.md", "rendered",
                                          lineterm=""))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when README.md's tables differ")
    parser.add_argument("--write", action="store_true", help="write the tables into README.md")
    args = parser.parse_args(argv)
    rendered = render(load_results(HERE / "results"), benchmark_scripts(HERE))
    readme = README.read_text()
    if args.write:
        README.write_text(with_block(readme, rendered))
        print(f"wrote the speed tables into {README}")
        return 0
    if args.check:
        diff = difference(readme, rendered)
        if diff:
            print(f"README.md's speed tables differ from benchmarks/results (run with --write):\n{diff}")
            return 1
        print("README.md's speed tables match benchmarks/results")
        return 0
    print(rendered)
    return 0


if __name__ == "__main__":
    sys.exit(main())
