"""The node host: one detached actor per node, shared by every kernel and every placement there.

It owns the node's warm parent of rank processes (run/node/zygote.py: torch imported, CUDA never
touched) and a few spare worker actors already connected to it. A kernel's first call on the
node takes a spare (a Ray actor that is up, with torch imported in its warm parent) instead of
starting an actor process and a zygote of its own, so the first call of a new kernel is as warm
as its repeats, and a spread call finds warm workers on every node whatever the placement.

Lifetime, and who stops what:
- The first kernel that needs a worker on a node starts the node's host (named, detached, so
  later kernels find it, and it outlives the kernel that happened to start it). It has no
  owner: it stops itself, and everything it started, once no worker it handed out is alive and
  nobody asked for one for GPUSESSION_NODE_HOST_IDLE_S (default 600 s). Its node's death, or
  the cluster's, ends it too.
- The host starts the zygote (its child process; the zygote exits when the host's control
  socket closes, so it never outlives the host) and the spare workers (actors it owns: Ray ends
  them with it). A zygote killed while idle is started again at the next call that needs it.
- A kernel's workers are killed by that kernel (pool.py), by the broker when it takes a lease
  back, or, when the kernel died without doing so, by the host once Ray reports the kernel's job
  dead (every REAP_EVERY_S). The GPUs never wait for that: a dead kernel's placement group is
  removed by Ray, and the worker's watchdog kills its rank then (workers.py).
A call with its own runtime_env does not use the host: its workers start their own zygote, in
that environment, and die with the kernel as before.
Under `gpusession hub` (GPUSESSION_LAUNCHER set) the node's warm parent is root's launcher
(gpusession/launcher/): the host starts none, and its workers connect to the launcher, which
starts each rank as its caller's account (a call with its own runtime_env too).
"""
from __future__ import annotations

import json
import os
import threading
import time

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ..._version import __version__
from . import warmdir
from .zygote import Zygote
from .worker import NODE_HOST_NAMESPACE, ZYGOTE_START_TIMEOUT_S, Worker, launcher_path

NAMESPACE = NODE_HOST_NAMESPACE
IDLE_S_ENV = "GPUSESSION_NODE_HOST_IDLE_S"
DEFAULT_IDLE_S = 600.0
SPARES_ENV = "GPUSESSION_SPARE_WORKERS"
MAX_DEFAULT_SPARES = 8  # one per GPU of the node, up to this: each spare is a ~100 MB process
REAP_EVERY_S = 2.0
# What only later calls need waits, on a cold node, until no worker was asked for this long: the
# spares that replace those handed out before (each a Ray worker process) and the prober (a Ray
# driver process). Both started beside a cold node's first call and took the CPU its own workers,
# warm parent and ranks needed (benchmarks/spread_first.py); meanwhile a call that finds no spare
# starts a worker itself, and probes its bundles itself. Once the host has been quiet that long
# (it is settled), a spare handed out is replaced at once, as a restart after a lost host wants.
# Counted from the last request, not from the host's start: on a loaded machine a cold node's
# first call asked for its workers more than QUIET_S after the host started, and the replacements
# then started beside it all the same.
QUIET_S = 10.0
SPARE_READY_TIMEOUT_S = 180.0
PROBE_TIMEOUT_S = 60.0  # a spare on a loaded node may take a while to start
# Threads: `stop` and `request_checkpoint` must reach the actor while its `run` streams.
REMOTE_WORKER = ray.remote(num_cpus=0, max_restarts=0, max_concurrency=4)(Worker)


def host_name(node_id: str) -> str:
    """One host per node and gpusession version: a kernel never uses an older client's code."""
    return f"gpusession-node-host-{__version__}-{node_id}"


# Ray starts its worker processes at niceness 15 (ray_constants.RAY_WORKER_NICENESS); the warm
# parent is this host's child and every rank its fork, so ranks trained at 15: on a busy node any
# process at 0 (a data loader, another user's job, torchrun's ranks) took the CPU from them
# (benchmarks/scaling.py measured 0.83x torchrun's samples/s where the CPU set the pace). Ray's own
# job supervisor asks for 0 the same way.
RANK_PRIORITY = {"env_vars": {"RAY_worker_niceness": "0"}}


def host_for(node_id: str, spares: int) -> ray.actor.ActorHandle:
    """The node's host, started now if it is not running."""
    return ray.remote(NodeHost).options(
        name=host_name(node_id), namespace=NAMESPACE, lifetime="detached", get_if_exists=True,
        num_cpus=0, max_restarts=0, max_concurrency=64, runtime_env=RANK_PRIORITY,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
    ).remote(node_id, spares)


def spares_due(now: float, last_request: float, settled: bool, asking: int) -> bool:
    """Whether the host starts spares (to their number) and its prober now: at once on a settled
    host; on one that never was quiet (a cold node, its first call still asking for workers),
    once no request is waiting for its worker (`asking`: a spare's start may take long) and the
    last one was answered QUIET_S ago."""
    return settled or (asking == 0 and now - last_request >= QUIET_S)


def default_spares(node_gpus: float) -> int:
    configured = os.environ.get(SPARES_ENV)
    if configured is not None:
        try:
            count = int(configured)
        except ValueError:
            count = -1
        if count < 0:
            raise ValueError(f"{SPARES_ENV}={configured!r} must be a whole number of spare workers per node "
                             "(0 turns spares off).")
        return count
    return max(1, min(MAX_DEFAULT_SPARES, int(-(-node_gpus // 1))))


class NodeHost:
    def __init__(self, node_id: str, spares: int) -> None:
        self.node_id = node_id
        self.name = host_name(node_id)
        self._lock = threading.Lock()
        self._launcher = launcher_path()
        self._warm_dir: warmdir.WarmDir | None = None
        if self._launcher:  # root's launcher is the node's warm parent; this host only connects to it
            self.socket_path = self._launcher
        else:
            warmdir.sweep()  # what hosts that Ray ended left (a stopped cluster, a killed actor)
            self._warm_dir = warmdir.make()
            self.socket_path = self._warm_dir.socket_path
        self._zygote = self._warm_parent()
        self._target = spares
        self._spares: list[tuple[ray.actor.ActorHandle, ray.ObjectRef]] = []
        self._adopted: dict[ray.actor.ActorHandle, str] = {}  # worker handed out -> the kernel's job id
        self._last_request = time.monotonic()  # asked for or handed out a worker
        self._asking = 0  # requests waiting for their worker
        self._settled = False  # quiet once since it started (see QUIET_S)
        self._idle_s = float(os.environ.get(IDLE_S_ENV, DEFAULT_IDLE_S))
        self._stopping = False
        self._prober: Prober | None = None  # started once the node is quiet (QUIET_S)
        self._top_up()
        threading.Thread(target=self._reap_forever, name="gpusession-node-host-reaper", daemon=True).start()

    # ----- what kernels ask -------------------------------------------------------------------------
    def info(self) -> dict:
        self._zygote.wait_ready(ZYGOTE_START_TIMEOUT_S)
        return {"pid": os.getpid(), "zygote_pid": self._zygote.pid, "node_id": self.node_id,
                "warm_dir": self._warm_dir.path if self._warm_dir is not None else None}

    def worker(self, job_id: str) -> ray.actor.ActorHandle:
        """A worker actor connected to this node's warm parent, ready, for the kernel of job_id."""
        with self._lock:
            self._asking += 1
            self._last_request = time.monotonic()
        try:
            return self._hand_out(job_id)
        finally:
            with self._lock:
                self._asking -= 1
                self._last_request = time.monotonic()  # quiet counts from the answer: a spare's start may be slow

    def _hand_out(self, job_id: str) -> ray.actor.ActorHandle:
        for _ in range(3):  # a spare may have died while it waited (the OOM killer)
            with self._lock:
                handle, ready = self._spares.pop(0) if self._spares else self._start_spare()
                due = spares_due(time.monotonic(), self._last_request, self._settled, self._asking)
            if due:
                self._top_up()
            try:
                ray.get(ready, timeout=SPARE_READY_TIMEOUT_S)
            except Exception:
                _kill(handle)
                continue
            with self._lock:
                self._adopted[handle] = job_id
            return handle
        raise RuntimeError(f"Could not start a worker on node {self.node_id}: three tries failed.")

    def probe_ready(self) -> bool:
        """Whether probe() answers now; a prober that died is started again (ready a bit later)."""
        try:
            return self._live_prober().ready()
        except RuntimeError:  # not started yet (a cold node's first call probes by itself)
            return False

    def probe(self, group_id: str, indices: list[int], gpus: float) -> list[tuple[str, str, list[str]]]:
        """(node id, address, GPU ids) of each of these bundles of the group (all on this node),
        found by the prober."""
        return self._live_prober().probe(group_id, indices, gpus)

    def _live_prober(self) -> "Prober":
        with self._lock:
            if self._prober is None:
                raise RuntimeError("The node's prober is not started yet.")
            if not self._prober.alive():
                self._prober.close()
                self._prober = Prober()
            return self._prober

    def _when_quiet(self) -> None:
        """Spares back to their number and the prober started, once no worker was asked for
        QUIET_S (see there)."""
        with self._lock:
            due = spares_due(time.monotonic(), self._last_request, self._settled, self._asking)
        if not due:
            return
        self._settled = True
        self._top_up()
        with self._lock:
            if self._prober is None and not self._stopping:
                self._prober = Prober()

    def ensure_zygote(self) -> int:
        """Start the warm parent again if it died (killed while idle); its pid once it is ready."""
        with self._lock:
            if not self._zygote.alive():
                self._zygote.close()
                self._zygote = self._warm_parent()
            zygote = self._zygote
        zygote.wait_ready(ZYGOTE_START_TIMEOUT_S)
        return zygote.pid

    def _warm_parent(self) -> Zygote:
        if self._launcher:
            return Zygote.connect(self._launcher, ZYGOTE_START_TIMEOUT_S)
        return Zygote.start(self.socket_path)

    # ----- spares -----------------------------------------------------------------------------------
    def _start_spare(self) -> tuple[ray.actor.ActorHandle, ray.ObjectRef]:
        actor = REMOTE_WORKER.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(self.node_id, soft=False),
        ).remote(zygote_path=self.socket_path, host_name=self.name)
        return actor, actor.info.remote()

    def _top_up(self) -> None:
        with self._lock:
            while len(self._spares) < self._target:
                self._spares.append(self._start_spare())

    # ----- lifetime ---------------------------------------------------------------------------------
    def _reap_forever(self) -> None:
        from ...cluster.raycluster import dead_job_ids

        while True:
            time.sleep(REAP_EVERY_S)
            try:
                self._when_quiet()
                with self._lock:
                    adopted = dict(self._adopted)
                dead = dead_job_ids(set(adopted.values())) if adopted else set()
                for handle, job_id in adopted.items():
                    if job_id in dead:  # the kernel died without killing its workers
                        _kill(handle)
                        with self._lock:
                            self._adopted.pop(handle, None)
                if self._idle_long_enough():
                    self._stop()
                    return
            except Exception:  # GCS briefly unreachable: try again next round
                continue

    def _idle_long_enough(self) -> bool:
        if time.monotonic() - self._last_request < self._idle_s:
            return False
        with self._lock:
            adopted = list(self._adopted)
        answers = [handle.info.remote() for handle in adopted]
        alive = 0
        for answer in answers:
            try:
                ray.get(answer, timeout=5.0)
                alive += 1
            except Exception:
                pass
        return alive == 0

    def _stop(self) -> None:
        """Everything this host started goes with it: spares (owned actors), the zygote, its socket."""
        with self._lock:
            spares, self._spares, self._target = self._spares, [], 0
            self._stopping = True
            prober = self._prober
        for handle, _ in spares:
            _kill(handle)
        self._zygote.close()
        if prober is not None:
            prober.close()
        if self._warm_dir is not None:
            self._warm_dir.remove()
        ray.kill(ray.get_runtime_context().current_actor, no_restart=True)


class Prober:
    """The host's handle on its prober process (prober.py), which it owns."""

    def __init__(self) -> None:
        import subprocess
        import sys

        self.process = subprocess.Popen(
            [sys.executable, "-m", "gpusession.run.node.prober", ray.get_runtime_context().gcs_address,
             ray.util.get_node_ip_address()],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=dict(os.environ),
        )
        self._lock = threading.Lock()
        self._next = 0
        self._waiting: dict[int, list] = {}  # request id -> [event, answer]
        self._ready = threading.Event()
        threading.Thread(target=self._read, name="gpusession-prober-reader", daemon=True).start()

    def alive(self) -> bool:
        return self.process.poll() is None

    def ready(self) -> bool:
        return self._ready.is_set() and self.alive()

    def probe(self, group_id: str, indices: list[int], gpus: float) -> list[tuple[str, str, list[str]]]:
        if not self._ready.is_set():  # still starting: the kernel's own probe is faster now
            raise RuntimeError("The node's prober is still starting.")
        done = threading.Event()
        with self._lock:
            self._next += 1
            request_id = self._next
            self._waiting[request_id] = [done, None]
            self.process.stdin.write(json.dumps({"id": request_id, "group": group_id, "indices": indices,
                                                 "gpus": gpus}) + "\n")
            self.process.stdin.flush()
        if not done.wait(PROBE_TIMEOUT_S) or self._waiting[request_id][1] is None:
            self._waiting.pop(request_id, None)
            raise RuntimeError("The node's prober did not answer.")
        answer = self._waiting.pop(request_id)[1]
        if "error" in answer:
            raise RuntimeError(answer["error"])
        return [(node_id, address, gpu_ids) for node_id, address, gpu_ids in answer["slots"]]

    def close(self) -> None:
        try:
            self.process.stdin.close()  # the prober exits at end of input
            self.process.wait(5.0)
        except Exception:
            self.process.kill()
            self.process.wait()

    def _read(self) -> None:
        for line in self.process.stdout:
            message = json.loads(line)
            if message.get("ready"):
                self._ready.set()
                continue
            entry = self._waiting.get(message.get("id"))
            if entry is not None:
                entry[1] = message
                entry[0].set()
        for entry in list(self._waiting.values()):  # it died: nobody waits forever
            entry[0].set()


def _kill(handle) -> None:
    try:
        ray.kill(handle, no_restart=True)
    except Exception:  # already gone
        pass
