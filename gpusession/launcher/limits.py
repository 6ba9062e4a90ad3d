"""PURE: the resource limits a user's login would get from `/etc/security/limits.conf` and
`limits.d/*.conf`, decided as Linux-PAM's pam_limits decides them, so that a rank (which is no
login: PAM never runs for it) starts with the same limits as its user's shell.

What pam_limits does, and so this module:
- files in order: limits.conf, then every limits.d/*.conf by file name; a line is
  `<domain> <type> <item> <value>`, `#` starts a comment, a line it cannot read is skipped;
- domains: the user's name; `*`; `@group` (the user's primary or a supplementary group), `@:gid`,
  `@min:max` and `@min:` (ranges match the primary gid); `min:max`, `:uid`, `min:` (uid ranges,
  as the user's name); `%...` applies to maxlogins only;
- precedence: a limit set by a user entry is not changed by a group or `*` entry, nor one set by
  a group entry by `*`; a later entry of the same or a more specific kind replaces it;
- `<domain> -` alone (two fields) that matches: the user gets no limits from these files at all;
- units: kB for fsize, data, stack, core, rss, memlock and as; minutes for cpu; `nice` is
  20 - value; `unlimited`, `infinity`, `-1` or `-` mean no limit (for nofile: fs.nr_open);
- `priority` sets the nice value, `nonewprivs 1` sets no_new_privs.
What a rank does not take: a positive maxlogins or maxsyslogins counts login sessions, and a rank
is none; but 0 (no login at all) refuses the rank, as it refuses the login.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum

UNLIMITED = 2**64 - 1  # RLIM_INFINITY as the kernel holds it (Python's resource module says -1)

# item -> (Linux resource number, unit multiplier); numbers from <asm-generic/resource.h>
RESOURCES: dict[str, tuple[int, int]] = {
    "cpu": (0, 60), "fsize": (1, 1024), "data": (2, 1024), "stack": (3, 1024), "core": (4, 1024),
    "rss": (5, 1024), "nproc": (6, 1), "nofile": (7, 1), "memlock": (8, 1024), "as": (9, 1024),
    "locks": (10, 1), "sigpending": (11, 1), "msgqueue": (12, 1), "nice": (13, 1), "rtprio": (14, 1),
    "rttime": (15, 1),
}
NOFILE = RESOURCES["nofile"][0]
LOGINS = ("maxlogins", "maxsyslogins")
OTHER_ITEMS = ("priority", "nonewprivs", *LOGINS)

class LimitType(Enum):
    """An entry's <type>: the soft limit, the hard one, or both ("-")."""

    SOFT = "soft"
    HARD = "hard"
    BOTH = "-"


SETS_SOFT = (LimitType.SOFT, LimitType.BOTH)
SETS_HARD = (LimitType.HARD, LimitType.BOTH)


# where an entry came from, most specific first (pam_limits' LIMITS_DEF_*)
USER, GROUP, ALLGROUP, ALL, DEFAULT, UNSET = range(6)


@dataclass(frozen=True)
class Who:
    """The account the limits are for, with every group it is in (primary and supplementary)."""

    name: str
    uid: int
    gid: int
    group_ids: frozenset[int]
    group_names: frozenset[str]


@dataclass(frozen=True)
class Rlimit:
    resource: int  # Linux's number (RLIMIT_NOFILE is 7)
    item: str  # its limits.conf name
    soft: int  # in the kernel's units; UNLIMITED for none, -1 where no entry sets it (the launcher's stays)
    hard: int


@dataclass(frozen=True)
class UserLimits:
    rlimits: tuple[Rlimit, ...] = ()
    priority: int | None = None  # the nice value to start with
    no_new_privs: bool = False
    no_login: str | None = None  # the entry that gives the user maxlogins 0, when one does
    exempt: str | None = None  # the `<domain> -` entry that takes every limit away, when one does
    skipped: tuple[str, ...] = ()  # "file:line: why", lines pam_limits would skip too


@dataclass
class _Slot:
    value: int = 0
    source: int = UNSET


@dataclass
class _State:
    soft: dict[int, _Slot] = field(default_factory=dict)
    hard: dict[int, _Slot] = field(default_factory=dict)
    logins: _Slot = field(default_factory=_Slot)
    logins_entry: str = ""
    priority: int | None = None
    no_new_privs: bool = False
    skipped: list[str] = field(default_factory=list)


def user_limits(files: list[tuple[str, str]], who: Who, *, nr_open: int) -> UserLimits:
    """files: (path, text) in pam_limits' order (limits_files_in_order); nr_open: the kernel's
    fs.nr_open, what `nofile unlimited` becomes."""
    state = _State()
    for path, text in files:
        for number, raw in enumerate(text.splitlines(), 1):
            where = f"{path}:{number}"
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            fields = line.split(None, 3)
            domain = fields[0]
            span = _range(domain)
            if span == "bad":
                state.skipped.append(f"{where}: {domain!r} is not a valid uid or gid range")
                continue
            if len(fields) == 2 and fields[1].startswith("-"):
                if _exempts(domain, span, who):
                    return UserLimits(exempt=where, skipped=tuple(state.skipped))
                continue
            if len(fields) != 4:
                state.skipped.append(f"{where}: not '<domain> <type> <item> <value>'")
                continue
            item, value = fields[2].lower(), fields[3].lower()
            source = _source(domain, span, who)
            if source is not None:
                _take(state, source, _limit_type(fields[1]), fields[1], item, value, where, nr_open)
    return UserLimits(
        rlimits=_rlimits(state), priority=state.priority, no_new_privs=state.no_new_privs,
        no_login=state.logins_entry if state.logins.source != UNSET and state.logins.value == 0 else None,
        skipped=tuple(state.skipped))


def with_current(limit: Rlimit, current: tuple[int, int]) -> tuple[int, int]:
    """(soft, hard) to set, from what the launcher has (the rank's start) and this user's limit;
    the soft one is never above the hard one (as pam_limits)."""
    soft, hard = limit.soft, limit.hard
    if soft < 0:
        soft = current[0]
    if hard < 0:
        hard = current[1]
    return min(soft, hard), hard


def limits_files_in_order(main: str | None, directory: list[str]) -> list[str]:
    """limits.conf (when there is one) first, then limits.d's *.conf files by file name."""
    return ([main] if main else []) + sorted(directory, key=lambda path: path.rsplit("/", 1)[-1])


# ----- the decisions pam_limits makes for each line --------------------------------------------------
_NUMBER = re.compile(r"[+]?(\d+)")
_SIGNED = re.compile(r"[+-]?\d+")


def _range(domain: str) -> tuple[int, int] | None | str:
    """(low, high) for a uid or gid range (high UNLIMITED when open), None for no range, "bad"."""
    if ":" not in domain:
        return None
    body = domain[1:] if domain[:1] in "@%" else domain
    low_text, high_text = body.split(":", 1)
    if not low_text and not high_text:
        return "bad"
    if (low_text and not low_text.isdigit()) or (high_text and not high_text.isdigit()):
        return "bad"
    if not low_text:
        return int(high_text), int(high_text)
    return int(low_text), int(high_text) if high_text else UNLIMITED


def _in(value: int, span: tuple[int, int]) -> bool:
    return span[0] <= value <= span[1]


def _source(domain: str, span, who: Who) -> int | None:
    """Which kind of entry this is for the user, or None when it is not theirs."""
    if domain == who.name:
        return USER
    if domain.startswith("@"):
        if span is None:
            return GROUP if domain[1:] in who.group_names else None
        exact = domain[1:].startswith(":")
        if exact:  # @:gid matches any group the user is in
            return GROUP if span[0] in who.group_ids else None
        return GROUP if _in(who.gid, span) else None  # a range: the primary group only
    if domain.startswith("%"):
        if span is None:
            return ALL if domain == "%" else (ALLGROUP if domain[1:] in who.group_names else None)
        return ALLGROUP if domain[1:].startswith(":") and span[0] in who.group_ids else None
    if span is None:
        return DEFAULT if domain == "*" else None
    return USER if _in(who.uid, span) else None


def _exempts(domain: str, span, who: Who) -> bool:
    """A `<domain> -` line: does it take this user's limits away?"""
    if domain == who.name:
        return True
    if domain.startswith("@"):
        if span is None:
            return domain[1:] in who.group_names
        if domain[1:].startswith(":"):
            return span[0] in who.group_ids
        return _in(who.gid, span)
    return span is not None and _in(who.uid, span)


def _limit_type(text: str) -> LimitType | None:
    try:
        return LimitType(text.lower())
    except ValueError:
        return None


def _take(state: _State, source: int, limit_type: LimitType | None, written: str, item: str, value: str,
          where: str, nr_open: int) -> None:
    if item not in RESOURCES and item not in OTHER_ITEMS:
        state.skipped.append(f"{where}: unknown item {item!r}")
        return
    if limit_type is None and item not in (*LOGINS, "nonewprivs"):
        state.skipped.append(f"{where}: unknown type {written!r} (soft, hard or -)")
        return
    if source in (ALL, ALLGROUP) and item not in LOGINS:
        return  # a % domain is for maxlogins only
    if item == "nonewprivs":
        if value in ("0", "1"):
            state.no_new_privs = value == "1"
        else:
            state.skipped.append(f"{where}: nonewprivs is 0 or 1, not {value!r}")
        return
    if item in ("priority", "nice", *LOGINS):
        number = _SIGNED.match(value)
        if not number:
            state.skipped.append(f"{where}: {item} needs a number, not {value!r}")
            return
        amount = int(number.group())
        if item == "priority":
            state.priority = amount
            return
        if item in LOGINS:
            if source <= state.logins.source:
                state.logins = _Slot(amount, source)
                state.logins_entry = where
            return
        kernel = 20 - max(-20, min(19, amount))  # RLIMIT_NICE
    else:
        kernel = _amount(item, value, nr_open)
        if kernel is None:
            state.skipped.append(f"{where}: {item} needs a number or 'unlimited', not {value!r}")
            return
    resource = RESOURCES[item][0]
    if limit_type in SETS_SOFT:
        slot = state.soft.setdefault(resource, _Slot())
        if slot.source < source:
            return  # (pam_limits then leaves the hard one alone too)
        state.soft[resource] = _Slot(kernel, source)
    if limit_type in SETS_HARD:
        slot = state.hard.setdefault(resource, _Slot())
        if slot.source < source:
            return
        state.hard[resource] = _Slot(kernel, source)


def _amount(item: str, value: str, nr_open: int) -> int | None:
    resource, unit = RESOURCES[item]
    if value in ("-1", "-", "unlimited", "infinity"):
        return nr_open if resource == NOFILE else UNLIMITED
    number = _NUMBER.match(value)
    if not number:
        return None
    amount = int(number.group(1))
    return UNLIMITED if amount * unit >= UNLIMITED else amount * unit


def _rlimits(state: _State) -> tuple[Rlimit, ...]:
    names = {number: item for item, (number, _) in RESOURCES.items()}
    found = []
    for resource in sorted(set(state.soft) | set(state.hard)):
        soft, hard = state.soft.get(resource, _Slot()), state.hard.get(resource, _Slot())
        if soft.source == UNSET and hard.source == UNSET:
            continue
        found.append(Rlimit(resource, names[resource], soft.value if soft.source != UNSET else -1,
                            hard.value if hard.source != UNSET else -1))
    return tuple(found)
