"""The leases a process holds (run/caller/held.py): what %gpu lists and %gpu_release releases."""
from __future__ import annotations

import threading

from gpusession.run.caller import held


class _Lease:
    def __init__(self) -> None:
        self.released = False
        self.reasons: list[str] = []

    def release(self, reason: str = "finished") -> None:
        self.reasons.append(reason)
        self.released = True
        held.discard(self)


def test_release_all_releases_each_held_lease_once_and_lists_none_after():
    first, second, done = _Lease(), _Lease(), _Lease()
    done.released = True
    for lease in (first, second, done):
        held.add(lease)
    try:
        assert set(held.held_leases()) == {first, second}
        assert held.release_all("released") == 2
        assert first.reasons == second.reasons == ["released"] and done.reasons == []
        assert held.held_leases() == []
    finally:
        held.discard(done)


def test_listing_while_other_threads_acquire_and_release_never_fails():
    stop, errors = threading.Event(), []
    keep = [_Lease() for _ in range(50)]  # strong references: the set is weak

    def churn() -> None:
        while not stop.is_set():
            for lease in keep:
                held.add(lease)
            for lease in keep:
                held.discard(lease)

    threads = [threading.Thread(target=churn) for _ in range(3)]
    for thread in threads:
        thread.start()
    try:
        for _ in range(2000):
            try:
                held.held_leases()
            except RuntimeError as exc:  # "Set changed size during iteration" without the lock
                errors.append(exc)
                break
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert errors == []
