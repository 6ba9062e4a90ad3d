"""Would a maintainer accept a speed row as it stands? Pure decisions, no git and no files here:
benchmarks/_git_facts.py gathers the facts, benchmarks/report.py shows the findings in the table
and `--check --strict` fails on any.

A row is refused when
- its commit is older than the last change to its benchmark script or to the code it measures
  (the paths its results file names and the project's modules they import; stale: re-measure),
- its commit is "+dirty" (the code measured is in no commit),
- its commit is not in this repository's history (nobody can tell what was measured),
- it is derived from a results file that was re-measured after it, or that is itself refused,
- it misses its goal and no `goal_note` beside it says why,
- a side has fewer than MIN_SAMPLES samples and no `samples_note` beside it says why (a sample
  that takes over a minute, a row that shows that something works rather than how fast).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

# What a results file measures when it does not say: the run path (its entry points in api/ too), the
# cluster glue and the broker; what they import (gpusession/observe, errors.py, ...) is judged with them
# (benchmarks/_import_closure.py), so these lists name only what a script runs.
DEFAULT_MEASURES = ("gpusession/api", "gpusession/run", "gpusession/cluster", "gpusession/broker")
# What each script measures besides DEFAULT_MEASURES: its helpers and the code its figures depend
# on (a results file records the whole list when written; older files are judged by this).
EXTRA_MEASURES = {
    "call_overhead": ("benchmarks/_call_phases.py", "benchmarks/_ray_pool.py", "benchmarks/_gateway_side.py",
                      "gpusession/gateway"),
    "recovery": ("benchmarks/_ray_pool.py",),
    "multihost": ("benchmarks/_multihost_driver.py", "benchmarks/_ray_pool.py", "tests/multihost/simcluster.py",
                  "tests/multihost/hostkill.py"),
    "elastic": ("benchmarks/_elastic_hosts.py", "benchmarks/_elastic_hosts_driver.py", "tests/multihost/simcluster.py",
                "tests/integration/elastic_train.py"),
    "scaling": ("benchmarks/_scaling_train.py", "benchmarks/_scaling_driver.py", "tests/multihost/simcluster.py",
                "tests/multihost/linkrelay.py", "gpusession/run/comm_options.py"),
    "gpu_check": ("benchmarks/_scaling_train.py", "gpusession/run/comm_options.py"),
    "powersgd_loss": ("gpusession/run/comm_options.py",),
    "spread_ddp": ("benchmarks/_spread_ddp_driver.py", "tests/multihost/simcluster.py"),
    "spread_first": ("benchmarks/_spread_first_driver.py", "benchmarks/_spread_first_train.py",
                     "tests/multihost/simcluster.py"),
    "ddp_step_overhead": ("benchmarks/ddp_loop.py",),
    "sweep": ("gpusession/sweeps",),
    "cli_status": ("gpusession/cli/main.py", "gpusession/broker/http/status_endpoint.py"),
    # the user's kernel calls the service's gateway, whose server runs the call and asks the root
    # launcher for the ranks: processes of their own, so no import of the script reaches them
    "hub": ("gpusession/hub", "jupyter_ext", "gpusession/gateway", "gpusession/launcher", "gpusession/notebook"),
    "attach": ("gpusession/gateway",),
    "before_gateway": ("benchmarks/_before_side.py", "benchmarks/_gateway_side.py", "gpusession/gateway",
                       "gpusession/notebook"),
    "utilization_replay": ("benchmarks/_replay_world.py", "benchmarks/_kueue_baseline.py"),
}


def measures_of(script: str) -> tuple[str, ...]:
    """The code a script's figures depend on, besides the script itself."""
    return DEFAULT_MEASURES + EXTRA_MEASURES.get(script, ())


# Results files computed from other results files (older files do not name their inputs).
DEFAULT_DERIVED_FROM = {"utilization_replay": ("call_overhead", "elastic")}

MIN_SAMPLES = 5  # per side, where a sample takes under a minute (issue 29)
_GOAL = re.compile(r"^\s*(<=|>=|<|>)\s*(\d+(?:\.\d+)?|\.\d+)\s*(ms|us|s)?(?![\w/])")
_SECONDS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}


class Refusal(Enum):
    """Why a row cannot stand as a current claim."""

    STALE = "stale"
    DIRTY = "dirty"
    UNKNOWN_COMMIT = "unknown commit"
    DERIVED_FROM_NEWER = "derived from newer results"
    DERIVED_FROM_REFUSED = "derived from refused results"
    GOAL_MISSED_UNEXPLAINED = "goal missed, unexplained"
    FEW_SAMPLES_UNEXPLAINED = "few samples, unexplained"


@dataclass(frozen=True)
class RowFacts:
    """What the history says about one row.

    commit: the commit the row was measured at, as recorded (may end in "+dirty"; None: unrecorded).
    changes_since: commits that changed the script or the measured code after `commit`, oldest
    first; None when `commit` is not in the history.
    newer_inputs: inputs (for a derived file) measured after this file was computed.
    refused_inputs: inputs that are themselves refused."""

    commit: str | None
    changes_since: tuple[str, ...] | None = ()
    newer_inputs: tuple[str, ...] = ()
    refused_inputs: tuple[str, ...] = ()


@dataclass(frozen=True)
class Finding:
    refusal: Refusal
    mark: str  # what the table shows beside the row


def goal_met(goal: str, row: dict) -> bool | None:
    """Whether the row meets its goal; None when the goal is not a bound this can read (free
    text), or the row has no figure to compare.

    A goal with a time unit ("< 10 ms", "<= 10 s (SPEC)") bounds gpusession's figure, converted
    from the row's unit; a goal without a unit bounds the ratio, or gpusession's figure when the
    row has no ratio (">= 500" grants per second with no alternative)."""
    match = _GOAL.match(goal or "")
    if not match:
        return None
    operator, bound, goal_unit = match.group(1), float(match.group(2)), match.group(3)
    value = _compared_value(row, goal_unit)
    if value is None:
        return None
    return {"<=": value <= bound, "<": value < bound, ">=": value >= bound, ">": value > bound}[operator]


def _compared_value(row: dict, goal_unit: str | None) -> float | None:
    mine = row.get("gpusession")
    if goal_unit:
        row_unit = row.get("unit", "")
        if not isinstance(mine, (int, float)) or row_unit not in _SECONDS:
            return None
        return mine * _SECONDS[row_unit] / _SECONDS[goal_unit]
    ratio = row.get("ratio")
    if isinstance(ratio, (int, float)):
        return ratio
    if row.get("alternative_value") in (None, "") and isinstance(mine, (int, float)):
        return mine  # no alternative: the goal is on gpusession's own figure
    return None


def judge(row: dict, facts: RowFacts) -> list[Finding]:
    """Every reason to refuse the row; empty when it stands."""
    findings = []
    commit = facts.commit or ""
    if commit.endswith("+dirty"):
        findings.append(Finding(Refusal.DIRTY, f"measured on uncommitted code ({commit}): re-measure"))
    if not commit or facts.changes_since is None:
        findings.append(Finding(Refusal.UNKNOWN_COMMIT,
                                f"commit {commit or '(none)'} not in this history: re-measure"))
    elif facts.changes_since:
        findings.append(Finding(Refusal.STALE, f"stale since {facts.changes_since[0]}: re-measure"))
    if facts.newer_inputs:
        findings.append(Finding(Refusal.DERIVED_FROM_NEWER,
                                f"inputs re-measured since ({', '.join(facts.newer_inputs)}): re-run"))
    if facts.refused_inputs:
        findings.append(Finding(Refusal.DERIVED_FROM_REFUSED,
                                f"derived from refused rows of {', '.join(facts.refused_inputs)}: re-run after them"))
    if goal_met(row.get("goal", ""), row) is False and not row.get("goal_note"):
        findings.append(Finding(Refusal.GOAL_MISSED_UNEXPLAINED, "goal missed, no goal_note says why"))
    fewest = fewest_samples(row)
    if fewest is not None and fewest < MIN_SAMPLES and not row.get("samples_note"):
        findings.append(Finding(Refusal.FEW_SAMPLES_UNEXPLAINED,
                                f"n={fewest} on a side, no samples_note says why: re-measure with {MIN_SAMPLES} or more"))
    return findings


def fewest_samples(row: dict) -> int | None:
    """The smaller sample count of the row's two sides (a side with none, as an alternative that
    cannot or a row with no alternative, does not count); None when neither side has samples."""
    counts = [len(row.get(side) or []) for side in ("gpusession_samples", "alternative_samples")]
    counts = [count for count in counts if count]
    return min(counts) if counts else None


def newer_inputs(derived_when: str, recorded: dict[str, str] | None, inputs_when: dict[str, str]) -> tuple[str, ...]:
    """The inputs of a derived file that were measured after it used them.

    recorded: each input's "when" as the derived file used it (None: the file predates the
    record, so an input newer than the derived file itself counts). Times are ISO-8601 UTC strings,
    which order as text."""
    newer = []
    for name, when in sorted(inputs_when.items()):
        used = (recorded or {}).get(name, derived_when if recorded is None else "")
        if when and when > used:
            newer.append(name)
    return tuple(newer)


def refused_summary(findings: list[tuple[str, list[Finding]]]) -> list[str]:
    """One line per refused row, for the terminal: 'NAME: mark; mark'."""
    return [f"{where}: " + "; ".join(f.mark for f in found) for where, found in findings if found]
