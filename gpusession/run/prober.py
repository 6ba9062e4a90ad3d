"""The node host's prober: a small Ray driver that finds which GPU ids Ray reserved for a bundle.

Only a task running inside a placement group bundle learns its GPU ids (`ray.get_gpu_ids()`),
and a task needs a Ray worker process of its job. A kernel's job is new at its first call, so a
probe of its own waits for a worker process to start (seconds on a loaded node), and the node
host's job is usually dead (it belongs to whichever kernel started the host), so Ray starts its
task workers cold every time. This process is a driver of its own: its job lives as long as it
does, so its probe tasks run in workers that are already up.

Started by the node host (nodehost.py), which owns it: it reads requests on stdin and exits when
stdin closes (the host stopped or died). Protocol, JSON lines:
  host -> prober: {"id": n, "group": placement group id (hex), "index": bundle, "gpus": per bundle}
  prober -> host: {"id": n, "slot": [node_id, address, [gpu ids]]} or {"id": n, "error": text}
"""
from __future__ import annotations

import json
import logging
import os
import sys
import threading

PROBE_TIMEOUT_S = 60.0
WARM_EVERY_S = 30.0  # run a no-op now and then, so Ray keeps a worker of this job up


def main() -> None:
    # Our answers go to the host on the original stdout; anything Ray prints goes to stderr.
    replies = open(os.dup(1), "w")
    os.dup2(2, 1)
    import ray
    from ray.util.placement_group import PlacementGroup
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    ray.init(address=sys.argv[1], logging_level=logging.ERROR, log_to_driver=False, namespace="gpusession")

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
            strategy = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=request["index"])
            node_id, address, gpus = ray.get(probe.options(num_gpus=request["gpus"], scheduling_strategy=strategy)
                                             .remote(), timeout=PROBE_TIMEOUT_S)
            answer({"id": request["id"], "slot": [node_id, address, gpus]})
        except Exception as exc:  # the group was removed meanwhile, or cannot be placed
            answer({"id": request["id"], "error": f"{type(exc).__name__}: {exc}"[:500]})

    def keep_warm() -> None:
        noop = ray.remote(num_cpus=0, max_calls=0)(lambda: None)
        while True:
            try:
                ray.get(noop.remote(), timeout=PROBE_TIMEOUT_S)
            except Exception:
                pass
            if stop.wait(WARM_EVERY_S):
                return

    stop = threading.Event()
    threading.Thread(target=keep_warm, name="gpusession-prober-warm", daemon=True).start()
    answer({"ready": True})
    for line in sys.stdin:
        threading.Thread(target=serve, args=(json.loads(line),), daemon=True).start()
    stop.set()  # the host is gone


if __name__ == "__main__":
    main()
