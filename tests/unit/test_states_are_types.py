"""States are types (issue 30 item 7): no code under gpusession/ or jupyter_ext/ compares a state,
a kind, a reason or a code with a string literal; it compares Enum members, parsed once where the
value comes in (a gateway message, a ledger row, Ray's table).

The rule the checker applies, to every module's AST:
- a *state-like operand* is a name or attribute called `state`, `kind`, `reason`, `code`,
  `status` or `event`, or ending in `_state`, `_kind`, `_reason`, `_code` or `_status`
  (`end_reason`, `wait_kind`), or a subscript or `.get(...)` of such a key (`row["state"]`,
  `view.get("end_reason")`);
- a *string literal* is a str constant, or a tuple, list or set of str constants only;
- a comparison `==`, `!=`, `in` or `not in` of a state-like operand with a string literal (on
  either side) fails the test, and so does a `match` on a state-like subject with a `case` of a
  str constant.
Nothing is exempt: a value that is not a state is named for what it is (the launcher's cgroup
mounts call /proc/mounts' filesystem type `fstype`; a device is matched by `device.type`, which
the rule leaves alone because `type` names no state of ours).
"""
from __future__ import annotations

import ast
import socket
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("gpusession", "jupyter_ext")
WORDS = frozenset({"state", "kind", "reason", "code", "status", "event"})
SUFFIXES = ("_state", "_kind", "_reason", "_code", "_status")
OPERATORS = (ast.Eq, ast.NotEq, ast.In, ast.NotIn)


def _name(node: ast.AST) -> str | None:
    """The name a state-like operand goes by: `state`, `x.state`, `x["state"]`, `x.get("state")`."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript) and _is_str(node.slice):
        return node.slice.value
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
            and node.args and _is_str(node.args[0])):
        return node.args[0].value
    return None


def _is_str(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def state_like(node: ast.AST) -> bool:
    name = (_name(node) or "").lower()
    return name in WORDS or name.endswith(SUFFIXES)


def string_literal(node: ast.AST) -> bool:
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return bool(node.elts) and all(_is_str(e) for e in node.elts)
    return _is_str(node)


def string_comparisons(source: str, filename: str = "<source>") -> list[str]:
    """Every comparison of a state-like operand with a string literal in `source`, as
    'file:line: code'."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            for left, op, right in zip(operands, node.ops, operands[1:]):
                if isinstance(op, OPERATORS) and (state_like(left) and string_literal(right)
                                                  or state_like(right) and string_literal(left)):
                    found.append(f"{filename}:{node.lineno}: {ast.unparse(node)[:120]}")
        elif isinstance(node, ast.Match) and state_like(node.subject):
            for case in node.cases:
                if any(isinstance(p, ast.MatchValue) and _is_str(p.value) for p in ast.walk(case.pattern)):
                    found.append(f"{filename}:{case.pattern.lineno}: match {ast.unparse(node.subject)} "
                                 f"case {ast.unparse(case.pattern)}")
    return found


def test_no_state_is_compared_with_a_string_literal():
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            found += string_comparisons(path.read_text(), str(path.relative_to(ROOT)))
    assert not found, "compare Enum members, parsed once where the value comes in:\n" + "\n".join(found)


@pytest.mark.parametrize("code", [
    'if lease.state == "queued": pass',
    'if "ended" != row["state"]: pass',
    'if message.kind in ("done", "failed"): pass',
    'if view.get("end_reason") not in {"rejected", "revoked"}: pass',
    'if wait_kind == "quota": pass',
    'if 0 < n and status != "ok": pass',
    'match message.kind:\n    case "run":\n        pass\n    case _:\n        pass',
])
def test_the_checker_catches_a_string_comparison(code):
    assert len(string_comparisons(code)) == 1, code


@pytest.mark.parametrize("code", [
    "if lease.state == LeaseState.QUEUED: pass",
    'if message.kind in (Kind.DONE, Kind.FAILED): pass',
    'if device.type == "cuda": pass',
    'if fstype in ("cgroup", "cgroup2"): pass',
    'if name == "state": pass',
    'match message.kind:\n    case Kind.RUN:\n        pass',
])
def test_the_checker_passes_enum_members_and_other_strings(code):
    assert string_comparisons(code) == []


def test_a_gateway_message_is_parsed_once_into_its_kind_and_event():
    from gpusession.gateway.frames import Connection
    from gpusession.gateway.kinds import Event, Kind

    left, right = socket.socketpair()
    with left, right:
        Connection(left).send(Kind.EVENT, event=Event.QUEUED, elapsed_s=1.5)
        message = Connection(right).receive()
    assert message.kind is Kind.EVENT and message.get("event") is Event.QUEUED
    assert message.kind == "event"  # the wire's own string, unchanged


@pytest.mark.parametrize("header, field", [(b'{"kind": "launch"}', "'kind'"),
                                           (b'{"kind": "event", "event": "exploded"}', "'event'")])
def test_a_gateway_message_of_unknown_kind_is_refused_naming_the_field(header, field):
    from gpusession.gateway.frames import Connection, FrameError

    left, right = socket.socketpair()
    with left, right:
        left.sendall(len(header).to_bytes(8, "big") + header)
        with pytest.raises(FrameError, match=field):
            Connection(right).receive()


def test_a_ledger_row_states_its_lease_state_as_the_enum(tmp_path):
    from gpusession.broker.storage.ledger import Ledger
    from gpusession.broker.policy.states import LeaseState

    ledger = Ledger(tmp_path / "ledger.db")
    lease_id = ledger.add_lease({"user": "alice", "gpus": 1.0, "workers": 1, "gpus_per_worker": 1.0,
                                 "priority": 1, "placement": "pack", "state": "queued", "requested_at": 1.0})
    assert ledger.lease(lease_id)["state"] is LeaseState.QUEUED
    assert list(ledger.db.query("select state from leases"))[0]["state"] == "queued"


def test_ray_placement_group_states_are_parsed_and_unknown_ones_refused():
    from gpusession.cluster.placement import PlacementState

    assert PlacementState.parse("CREATED") is PlacementState.CREATED
    with pytest.raises(ValueError, match="'state' is 'EXPLODED'"):
        PlacementState.parse("EXPLODED")
