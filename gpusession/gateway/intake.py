"""How many bytes of calls the gateway holds for each account at once (the hub's gateway is one
process that hosts every account's runs: one account's huge call must not take its memory).

A call crosses the gateway as raw frames (its pickle, then its arrays' buffers); they stay in the
gateway's memory until they are shipped into Ray's object store (just before the GPUs are asked
for; the pickle itself until the run ends). `CallBytes` counts them per account, across all of
that account's connections; `Intake` is one connection's share. Each payload frame is admitted
before its bytes are read (frames.Connection.admit); past the account's limit the frame is read
and dropped, and so is every later frame of that call, and the call is refused once its last
frame came (QuotaExceeded, naming the sizes and the admin's setting), nothing leased.

Out of the box the hub's gateway takes a quarter of its machine's memory per account
(`gpusession hub --call-bytes-per-user` sets it); a user's own gateway, which hosts only that
user's detached runs in that user's own process, takes no limit.
"""
from __future__ import annotations

import os
import re
import threading
from typing import Any

from ..errors import QuotaExceeded

OPTION = "--call-bytes-per-user"
MIN_LIMIT = 2**20  # below a MiB no call's pickle fits: an admin's typo, not a policy
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def size_of(text: Any, *, option: str = OPTION) -> int:
    """PURE: bytes from an admin's size ("8G", "512M", "1.5T", "4294967296"; K, M, G, T are powers
    of 1024), or ValueError naming the option and what to write."""
    match = _SIZE.match(str(text)) if isinstance(text, (str, int)) and not isinstance(text, bool) else None
    if match is None:
        raise ValueError(f"{option} {text!r}: give a size in bytes, or with a unit: e.g. 8G, 512M, 1.5T.")
    value = int(float(match.group(1)) * _UNITS[match.group(2).upper()])
    if value < MIN_LIMIT:
        raise ValueError(f"{option} {text!r} is under 1M: no call's pickle would fit. Give e.g. 8G.")
    return value


def default_limit() -> int:
    """A quarter of this machine's memory."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4


def shown(size: int) -> str:
    """PURE: a size as a user reads it (1 decimal, binary units)."""
    for unit, factor in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= factor:
            return f"{size / factor:.1f} {unit}"
    return f"{size} bytes"


class CallBytes:
    """The bytes of calls each account has in the gateway's memory now, across its connections;
    `limit` None: no limit. Thread-safe: every connection's reader takes and gives back."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = limit
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()

    def held(self, user: str) -> int:
        with self._lock:
            return self._held.get(user, 0)

    def take(self, user: str, size: int) -> bool:
        with self._lock:
            now = self._held.get(user, 0)
            if self.limit is not None and now + size > self.limit:
                return False
            self._held[user] = now + size
            return True

    def give_back(self, user: str, size: int) -> None:
        with self._lock:
            left = self._held.get(user, 0) - size
            if left > 0:
                self._held[user] = left
            else:
                self._held.pop(user, None)

    def intake(self, user: str) -> "Intake":
        return Intake(self, user)


class Intake:
    """One connection's calls: frames admitted against the account's limit as they come (by the
    connection's reader), given back as they leave the gateway's memory (`share`) or when the
    connection's work ends (`close`)."""

    def __init__(self, books: CallBytes, user: str) -> None:
        self.books, self.user = books, user
        self.held = 0  # this connection's bytes in the account's count
        self._call = 0  # bytes admitted for the call being received
        self._dropped = 0  # bytes of its frames read and dropped (0: none; the call is refused when >0)
        self._lock = threading.Lock()  # a held lease's reader admits the next call while a run gives back

    def admit(self, size: int) -> bool:
        """frames.Connection.admit: whether a payload frame of `size` bytes may be read."""
        with self._lock:
            if not self._dropped and self.books.take(self.user, size):
                self.held += size
                self._call += size
                return True
            self._dropped += size
            return False

    def refusal(self) -> QuotaExceeded | None:
        """Once a call's last frame came: the error that refuses it (its admitted bytes given back),
        or None; either way the next call is counted afresh."""
        with self._lock:
            admitted, dropped = self._call, self._dropped
            self._call = self._dropped = 0
        if not dropped:
            return None
        self._give_back(admitted)
        limit, others = self.books.limit, self.books.held(self.user)
        busy = f" ({shown(others)} of it held now by your other calls)" if others else ""
        return QuotaExceeded(
            f"This call's function and arguments are {shown(admitted + dropped)}, and the gpusession gateway holds at "
            f"most {shown(limit or 0)} of one account's calls at a time{busy}. Nothing was leased. Pass a path the "
            f"ranks can read and load the data inside the function, or ask an admin to raise `gpusession hub "
            f"{OPTION}`.")

    def share(self, frames: list) -> "Share":
        """The bytes of one admitted call (its frames), to give back as they leave."""
        return Share(self, sum(len(frame) for frame in frames))

    def close(self) -> None:
        self._give_back(self.held)

    def _give_back(self, size: int) -> None:
        with self._lock:
            size = min(size, self.held)
            self.held -= size
        self.books.give_back(self.user, size)


class Share:
    """One call's bytes in its connection's count: `shipped(n)` as its arrays go into the object
    store; the rest (its pickle) when the `with` block ends (the run ended)."""

    def __init__(self, intake: Intake, size: int) -> None:
        self.intake, self.left = intake, size

    def shipped(self, size: int) -> None:
        size = min(size, self.left)
        self.left -= size
        self.intake._give_back(size)

    def __enter__(self) -> "Share":
        return self

    def __exit__(self, *exc) -> None:
        self.shipped(self.left)


CALL_BYTES = CallBytes()  # the gateway process's count; the hub's gateway sets its limit (main.py)
