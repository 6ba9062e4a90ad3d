"""A caller that dies (a killed kernel) leaves no ghost lease: GPUs free within 5 s, in Ray and
in the broker's books, measured from the kill."""
from __future__ import annotations

import time

import gpusession as gs
from gpusession.broker import client

from ..conftest import CLUSTER_GPUS, free_gpus, wait_for

FREE_WITHIN_S = 5.0  # SPEC: GPUs free within 5 s of the kernel's death (typically ~1 s here)

HOLDS_TWO_GPUS = """
import gpusession as gs

@gs.distributed(gpus=2)
def train_forever():
    import time
    print("RUNNING", gs.context().lease_id, flush=True)
    while True:
        time.sleep(1)

train_forever()
"""


def _gpus_free_everywhere(broker, admin) -> bool:
    return free_gpus() == CLUSTER_GPUS and not client.call(broker.leases, admin)


def test_killing_a_caller_mid_run_frees_its_gpus_in_ray_and_the_broker_twice_in_a_row(cluster, quiet, driver, broker, admin):
    for attempt in range(2):
        caller = driver(HOLDS_TWO_GPUS)
        lease_id = int(caller.wait_for_line("[rank 0] RUNNING").split()[-1])
        assert free_gpus() == CLUSTER_GPUS - 2
        killed_at = caller.kill()
        wait_for(lambda: _gpus_free_everywhere(broker, admin), timeout=FREE_WITHIN_S,
                 message=f"GPUs free in Ray and the broker after kill #{attempt + 1}")
        freed_after = time.monotonic() - killed_at
        row = client.call(broker.leases, admin, True)
        ended = next(l for l in row if l["lease_id"] == lease_id)
        assert ended["state"] == "ended" and ended["end_reason"] == "caller gone", ended
        assert freed_after < FREE_WITHIN_S

    @gs.distributed(gpus=4)
    def uses_every_gpu():
        return gs.context().world_size

    assert uses_every_gpu() == 4


def test_a_queued_request_of_a_dead_caller_is_dropped(cluster, quiet, driver, broker, admin):
    with gs.lease(gpus=4):
        waiter = driver("""
            import gpusession as gs
            print("ASKING", flush=True)
            gs.lease(gpus=2)
        """)
        waiter.wait_for_line("ASKING")
        wait_for(lambda: any(l["state"] == "queued" for l in client.call(broker.leases, admin)), timeout=60,
                 message="the other caller's request queued")
        killed_at = waiter.kill()
        wait_for(lambda: not any(l["state"] == "queued" for l in client.call(broker.leases, admin)),
                 timeout=FREE_WITHIN_S, message="the dead caller's request dropped")
        assert time.monotonic() - killed_at < FREE_WITHIN_S
