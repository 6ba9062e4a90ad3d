"""What a benchmark measured, written to benchmarks/results/NAME.json with the machine it ran on
(format: the helpers' shared brief; benchmarks/report.py renders docs/speed.md's speed tables from
these files, so a figure on that page always has the file and the script behind it)."""
from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _freshness import measures_of  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
CANNOT = "cannot"  # the alternative truly cannot do it (the script shows why): no ratio


@dataclass(frozen=True)
class Row:
    """One line of a speed table: both sides' samples, what each was configured with, the goal."""

    measure: str
    unit: str
    gpusession_samples: list
    alternative: str = ""
    alternative_samples: list = field(default_factory=list)
    configured: str = ""
    goal: str = ""
    alternative_cannot: bool = False  # alternative_value "cannot" instead of a figure
    note: str = ""
    alternative_text: str = ""  # instead of a figure, e.g. "no error within 180 s": no ratio against a watch window
    goal_note: str = ""  # why a missed goal is missed (report.py --check --strict refuses a miss without one)
    samples_note: str = ""  # why a side has fewer than MIN_SAMPLES samples (--strict refuses that without one)
    simulated: bool = False  # this row's figures come from a virtual clock or simulated GPU time

    def as_json(self) -> dict:
        mine = median_or_none(self.gpusession_samples)
        theirs = CANNOT if self.alternative_cannot else median_or_none(self.alternative_samples)
        if self.alternative_text:
            theirs = self.alternative_text
        ratio = None
        if isinstance(theirs, float) and mine is not None and theirs > 0:
            ratio = round(mine / theirs, 4)
        row = {"measure": self.measure, "unit": self.unit, "gpusession": mine,
               "gpusession_samples": rounded(self.gpusession_samples), "alternative": self.alternative,
               "alternative_value": theirs, "alternative_samples": rounded(self.alternative_samples),
               "configured": self.configured, "ratio": ratio, "goal": self.goal}
        if self.note:
            row["note"] = self.note
        if self.goal_note:
            row["goal_note"] = self.goal_note
        if self.samples_note:
            row["samples_note"] = self.samples_note
        if self.simulated:
            row["simulated"] = True
        return row


def median_or_none(samples) -> float | None:
    return round(float(statistics.median(samples)), 4) if samples else None


def rounded(samples) -> list:
    return [round(float(value), 4) for value in samples]


def machine() -> dict:
    """The machine a figure was taken on: the machine is shared, so its load average matters."""
    described = {"cores": os.cpu_count(), "loadavg": [round(x, 2) for x in os.getloadavg()],
                 "python": platform.python_version(), "torch": _version("torch"), "ray": _version("ray"),
                 "gpusession_commit": _commit(), "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    gpus = _gpus()
    if gpus:
        described["gpus"] = gpus
    return described


def _gpus() -> list[str]:
    """The machine's NVIDIA GPUs by name (none here: the figures then are CPU ones)."""
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]


def _version(module: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(module)
    except Exception:  # not installed: say so rather than fail a long benchmark at its end
        return None


def _commit() -> str | None:
    if os.environ.get("GPUSESSION_COMMIT"):  # a copy of the checkout without .git (a lent GPU machine)
        return os.environ["GPUSESSION_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=RESULTS.parent, capture_output=True,
                             text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "gpusession", "benchmarks/*.py"],
                               cwd=RESULTS.parent.parent, capture_output=True, text=True, timeout=10)
        return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "") if out.returncode == 0 else None
    except OSError:
        return None


def write(name: str, rows: list[Row], *, simulated: bool = False, loadavg_before=None, script: str = "",
          merge: bool = False, details=None, folder: Path | None = None, measures: list[str] | None = None,
          derived_from: dict[str, str] | None = None) -> Path:
    """Write benchmarks/results/NAME.json (or FOLDER/NAME.json); loadavg_before (os.getloadavg() at
    the start) is kept too.
    script: the script's name when it is not NAME (a second results file of one script).
    merge: keep the file's rows this run did not measure (a script run one part at a time); a row
    measured again replaces the old one in place. Each row then carries its own machine and command,
    since the parts ran at different times and loads.
    details: what a script found besides its rows (kept, not rendered).
    measures: the code the figures depend on besides the script (paths from the repository root;
    None: _freshness.measures_of(the script), gpusession/api, run, cluster, broker and the
    script's helpers); a row is stale once any of them, or a module of the project they import,
    changes after its commit.
    derived_from: for figures computed from other results files, each input's name and the "when"
    of the figures used (inputs_when() gives them); the file is stale once an input is newer."""
    described = machine()
    if loadavg_before is not None:
        described["loadavg_at_start"] = [round(x, 2) for x in loadavg_before]
    command = f"python benchmarks/{script or name}.py {' '.join(sys.argv[1:])}".strip()
    measured = [row.as_json() for row in rows]
    folder = folder or RESULTS
    path = folder / f"{name}.json"
    if merge:
        for row in measured:
            row.update(machine=described, command=command)
        measured = merged(json.loads(path.read_text()) if path.exists() else None, measured)
    document = {"benchmark": name, "command": command, "machine": described, "rows": measured}
    if script:
        document["script"] = script
    if simulated:
        document["simulated"] = True
    if details is not None:
        document["details"] = details
    document["measures"] = list(measures if measures is not None else measures_of(script or name))
    if derived_from is not None:
        document["derived_from"] = dict(derived_from)
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=1) + "\n")
    return path


def merged(old: dict | None, new_rows: list[dict]) -> list[dict]:
    """The old document's rows with those measured again replaced (same measure), the rest kept
    with the machine and command they were measured with; new measures last."""
    fresh = {row["measure"]: row for row in new_rows}
    rows = []
    for row in (old or {}).get("rows", []):
        kept = {"machine": old.get("machine"), "command": old.get("command"), **row}
        rows.append(fresh.pop(row["measure"], kept))
    return rows + list(fresh.values())


def inputs_when(names, folder: Path | None = None) -> dict[str, str]:
    """For a derived file: each input results file's newest "when" (the figures it reads)."""
    found = {}
    for name in names:
        path = (folder or RESULTS) / f"{name}.json"
        if path.exists():
            found[name] = latest_when(json.loads(path.read_text()))
    return found


def latest_when(document: dict) -> str:
    """When the newest of a results file's rows was measured (a merged file's rows differ)."""
    whens = [str((row.get("machine") or {}).get("when", "")) for row in document.get("rows", [])]
    return max(whens + [str(document.get("machine", {}).get("when", ""))])


def spread(samples) -> str:
    """'median (min-max, n=3)' for printing."""
    if not samples:
        return "-"
    return f"{statistics.median(samples):.4g} ({min(samples):.4g}-{max(samples):.4g}, n={len(samples)})"

