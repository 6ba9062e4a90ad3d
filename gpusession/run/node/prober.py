"""The node host's prober: a small Ray driver that finds which GPU ids Ray reserved for a bundle.

Only a task running inside a placement group bundle learns its GPU ids (`ray.get_gpu_ids()`),
and a task needs a Ray worker process of its job. A kernel's job is new at its first call, so a
probe of its own waits for a worker process to start (seconds on a loaded node), and the node
host's job is usually dead (it belongs to whichever kernel started the host), so Ray starts its
task workers cold every time. This process is a driver of its own: its job lives as long as it
does, so its probe tasks run in workers that are already up.

Started by the node host (nodehost.py), which owns it, as `python -m gpusession.run.node.prober
GCS_ADDRESS NODE_IP`: it reads requests on stdin and exits when stdin closes (the host stopped or
died). Protocol, JSON lines:
  host -> prober: {"id": n, "group": placement group id (hex), "indices": [bundles on this node],
                   "gpus": per bundle}
  prober -> host: {"ready": true} once, then per request
                  {"id": n, "slots": [[node_id, address, [gpu ids]], ...]} or {"id": n, "error": text}
A request's bundles are probed one after another, so they all run in the one warm worker
(probed at once, all but one would wait for a new worker process); requests run side by side.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import threading

PROBE_TIMEOUT_S = 60.0
# A no-op this often keeps this job's worker on the node busy enough that Ray never counts it
# idle: a raylet kills workers idle for over 1 s once more are idle than the node has CPUs,
# and then the next probe waits seconds for a new worker (a few milliseconds of CPU a second).
WARM_EVERY_S = 0.5


def main() -> None:
    # Our answers go to the host on the original stdout; anything Ray prints goes to stderr.
    replies = open(os.dup(1), "w")
    os.dup2(2, 1)
    import ray
    from ray.util.placement_group import PlacementGroup
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

    # The node's own IP, as Ray knows it (from the host actor): left to guess, a driver on a host
    # without a default route attaches to another node's raylet, and then every probe and the
    # keep-warm no-op run through that node and this node's worker is never kept warm.
    ray.init(address=sys.argv[1], _node_ip_address=sys.argv[2], logging_level=logging.ERROR, log_to_driver=False,
             namespace="gpusession")

    @ray.remote(num_cpus=0, max_calls=0, max_retries=0)  # a probe whose group vanished must fail, not wait
    def probe() -> tuple[str, str, list[str]]:
        context = ray.get_runtime_context()
        return context.get_node_id(), ray.util.get_node_ip_address(), [str(g) for g in ray.get_gpu_ids()]

    write_lock = threading.Lock()

    def answer(message: dict) -> None:
        with write_lock:
            replies.write(json.dumps(message) + "\n")
            replies.flush()

    def serve(request: dict) -> None:
        try:
            group = PlacementGroup(ray.PlacementGroupID(bytes.fromhex(request["group"])))
            slots = []
            for index in request["indices"]:
                strategy = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=index)
                node_id, address, gpus = ray.get(probe.options(num_gpus=request["gpus"], scheduling_strategy=strategy)
                                                 .remote(), timeout=PROBE_TIMEOUT_S)
                slots.append([node_id, address, gpus])
            answer({"id": request["id"], "slots": slots})
        except Exception as exc:  # the group was removed meanwhile, or cannot be placed
            answer({"id": request["id"], "error": f"{type(exc).__name__}: {exc}"[:500]})

    # The no-op runs on this node (a worker elsewhere would not serve this node's probes), and
    # the host hears "ready" only once it ran: until then the worker the probes need is not up,
    # and the first probe would pay its start (seconds on a loaded node).
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    noop = ray.remote(num_cpus=0, max_calls=0)(lambda: None).options(scheduling_strategy=here)

    def keep_warm() -> None:
        while True:
            try:
                ray.get(noop.remote(), timeout=PROBE_TIMEOUT_S)
            except Exception:
                pass
            if not announced.is_set():
                announced.set()
                answer({"ready": True})
            if stop.wait(WARM_EVERY_S):
                return

    stop, announced = threading.Event(), threading.Event()
    threading.Thread(target=keep_warm, name="gpusession-prober-warm", daemon=True).start()
    for line in sys.stdin:
        threading.Thread(target=serve, args=(json.loads(line),), daemon=True).start()
    stop.set()  # the host is gone


if __name__ == "__main__":
    main()
