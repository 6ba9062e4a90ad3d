"""The client side of a lease: ask the broker, wait in its queue, hold the placement group,
release. A lease holds all its GPUs or none, and every way out of it releases them.

The broker's watch for the lease's notices is notice_watch.py, the process's list of held
leases held.py. What runs on the lease lives on the run path: `gs.lease` (api/lease_api.py),
its worker actors (run/caller/crew.py), the runs (run/caller/controller.py), resizes between runs
(run/caller/resize.py, run/caller/idle_resize.py), and what a caller is told when the broker takes a lease
back (run/caller/notices.py)."""
from __future__ import annotations

import collections
import logging
import threading
import time
import uuid
from typing import Any, Callable

import ray
from ray.util.placement_group import placement_group, remove_placement_group

from . import held
from ...cluster import raycluster
from .bundles import Slot, probe_slots, remove_group_and_wait, warm_probe_process
from ...broker.protocol.request import LeaseRequest, cell_label, notebook_label
from ...errors import GPUSessionError, Infeasible, QueueTimeout
from ...observe.events import Observer, RunInfo
from .holding import HeldLease
from ...identity import Identity, current_identity
from .interrupts import deferred_interrupts
from .kernelcell import asking_cell_id, asking_in_background, asking_notebook
from .options import RunOptions
from .crew import Crew
from ..endings import end_reason
from .notices import notice_error, queue_end_error
from .pool import WorkerHandle
from ...broker import client
from ...broker.policy import messages
from ...broker.protocol.notice import Notice
from ...broker.policy.states import LeaseState
from .notice_watch import NoticeWatch

log = logging.getLogger("gpusession")
PLACE_TIMEOUT_S = 30.0  # Ray should place a granted group at once; longer means foreign GPU use
RELEASE_WAITS_FOR_RESIZE_S = 30.0  # a release lets a resize between runs finish, up to this


class Lease(HeldLease):
    """GPUs held from the broker. Use `gs.lease(...)` to get one."""

    def __init__(self, options: RunOptions, *, observer: Observer | None = None,
                 info: RunInfo | None = None, identity: Identity | None = None,
                 asking: dict | None = None) -> None:
        self.options = options
        self.identity = identity  # None: this process's user (tools acting for others pass one)
        # {"notebook", "cell_id", "background"} as a kernel elsewhere said them (the gateway); None: this process's
        self.asking = asking
        self.observer = observer or Observer()
        self.info = info or RunInfo()
        self.lease_id: int | None = None
        self.slots: list[Slot] = []
        self.logical_gpus = False
        self.granted_at: float | None = None
        self.has_run = False  # a run began: the next one's setup starts when it is called, not at the grant
        self._lost_nodes: set[str] = set()  # hosts lost during a run: never used or waited on again
        self._avoided: set[str] = set()  # hosts the broker said were lost when it last placed GPUs for us
        self._pg = None
        self._pg_name: str | None = None
        self.size = options.lease.workers  # workers held now: an elastic lease shrinks and grows
        self._sized_at: float | None = None  # when the current size began
        self._gpu_seconds_before = 0.0  # GPU-seconds of earlier sizes
        self._watch: NoticeWatch | None = None  # started once the group is placed
        self.crew = Crew(options.runtime_env)  # its worker actors, one per bundle
        self._released = False
        self._lock = threading.Lock()
        # Held by a run (and by a resize between runs): the idle watcher of a held elastic lease
        # never resizes under a run, whose follower handles notices itself.
        self.run_lock = threading.RLock()
        self.lines_between_runs: list[str] = []  # resizes made with no run going, for the next run's RunInfo
        self.watched_while_idle = False  # run/caller/idle_resize.py watches it between runs

    # ----- public -------------------------------------------------------------------------------
    @property
    def gpus(self) -> float:
        """GPUs held now (an elastic lease's size changes; options.lease.gpus is what it asked for)."""
        return self.size * self.options.lease.gpus_per_worker

    @property
    def workers(self) -> int:
        return self.size

    @property
    def released(self) -> bool:
        return self._released

    def run(self, fn: Callable, *args: Any, **kwargs: Any) -> Any:
        """Run fn on every worker of this lease; returns rank 0's value (or all with return_all)."""
        return self.run_call(fn, args, kwargs)

    def run_call(self, fn: Callable | None, args: tuple, kwargs: dict, **how: Any) -> Any:
        """run(), with run_function's own keywords in `how` (the gateway's runs on a lease it holds
        for a kernel: the call's shipment made from its bytes, raw results, the caller's place)."""
        from .controller import run_function
        from .resize import check_between_runs

        if self._released:
            raise GPUSessionError(
                f"Lease {self.lease_id} was already released; get GPUs again with gs.lease(...)."
            )
        with self.run_lock:
            check_between_runs(self)
            error: BaseException | None = None
            try:
                return run_function(self, fn, args, kwargs, info=self.info, observer=self.observer, **how)
            except BaseException as exc:
                error = exc
                raise
            finally:  # each run of a held lease gets its receipt ("still held" until released)
                self.info.end_reason = end_reason(error)
                self.observer.finished(self.info, error)

    def release(self, reason: str = "finished") -> None:
        """Give the GPUs back now; waits (bounded) until Ray shows them free. Idempotent."""
        with deferred_interrupts():  # a second Ctrl-C must not cut the release in half
            with self._lock:
                if self._released:
                    return
                self._released = True
            # Not in the middle of a resize between runs (bounded: a stuck one must not keep the GPUs).
            resizing = self.watched_while_idle and self.run_lock.acquire(timeout=RELEASE_WAITS_FOR_RESIZE_S)
            try:
                self._release(reason)
            finally:
                if resizing:
                    self.run_lock.release()
                self.observer.released(self.info)

    # ----- acquiring ----------------------------------------------------------------------------
    def acquire(self, *, before_request: Callable[[], None] | None = None) -> "Lease":
        """Ask the broker for the GPUs and wait for them; `before_request` runs once Ray is
        connected and before the broker is asked (@gs.distributed ships the call's big arguments
        there: a call that cannot be shipped is refused with nothing leased or queued)."""
        from ..heartbeat import silence_timeout

        silence_timeout()  # a bad GPUSESSION_HOST_SILENCE_S fails here, before anything is leased
        self.observer.requesting(self.gpus, self.workers)  # the status line shows before Ray connects
        asked = time.time()  # the receipt's queue: connecting and a first call's broker start count too
        try:
            raycluster.ensure_connected()
            if before_request is not None:
                before_request()
            broker = client.broker()
            warm_probe_process()
            requested = time.time()
            view = client.call(broker.request, self._spec())
        except BaseException:
            self.observer.released(self.info)  # nothing was leased: what began with `requesting` ends
            raise
        self.lease_id = view["lease_id"]
        self.info.lease_id = self.lease_id
        held.add(self)
        try:
            view = self._wait_in_queue(broker, view, requested)
            self.granted_at = self._sized_at = time.time()
            self.info.queued_s = self.granted_at - asked
            self.info.gpus, self.info.workers = self.gpus, self.workers
            self.info.over_quota = bool(view.get("over_quota"))
            self._place(broker, view)
            self.observer.granted(self.info)
        except BaseException as exc:
            if self.granted_at is None:  # it gave up in the queue: the receipt shows how long it waited
                self.info.queued_s = time.time() - asked
            self.release("cancelled" if self.granted_at is None else end_reason(exc))
            raise
        return self

    def _spec(self) -> dict:
        lease, identity = self.options.lease, self.identity or current_identity()
        return LeaseRequest.parse({  # the broker's own checks, here first: a typo fails at once
            "request_id": uuid.uuid4().hex, "user": identity.user, "signature": identity.signature,
            "job_id": ray.get_runtime_context().get_job_id(), "workers": lease.workers,
            "gpus_per_worker": lease.gpus_per_worker, "min_workers": lease.min_workers,
            "priority": lease.priority.label, "placement": lease.placement.value,
            "max_hold_s": lease.max_hold_s, "queue_timeout_s": lease.queue_timeout_s,
            "sweep_id": lease.sweep_id, **self._asking(),
        }).to_dict()

    def _asking(self) -> dict:
        if self.asking is not None:
            return {"notebook": notebook_label(self.asking.get("notebook")),
                    "cell_id": cell_label(self.asking.get("cell_id")),
                    "background": bool(self.asking.get("background"))}
        return {"notebook": notebook_label(asking_notebook()), "cell_id": cell_label(asking_cell_id()),
                "background": asking_in_background()}

    def _wait_in_queue(self, broker, view: dict, requested: float) -> dict:
        timeout = self.options.lease.queue_timeout_s
        while view["state"] == LeaseState.QUEUED:
            elapsed = time.time() - requested
            self.observer.queued(view, elapsed)
            self.observer.poll()
            if timeout is not None and elapsed >= timeout:
                raise QueueTimeout(
                    f"No {messages.gpus_text(self.gpus)} within queue_timeout={timeout:g} s (position "
                    f"{view.get('position')}, {view.get('reason')}). Nothing was leased. Try later, ask "
                    "for fewer GPUs, or raise queue_timeout."
                )
            poll = 1.0 if timeout is None else max(0.05, min(1.0, timeout - elapsed))
            view = client.call(broker.wait, self.lease_id, view["version"], poll, auth=client.lease_auth(self.identity))
        if view["state"] == LeaseState.ENDED:
            raise queue_end_error(view)
        return view

    def _place(self, broker, view: dict) -> None:
        try:
            self._place_group(broker, view)
        except (ray.exceptions.RayError, Infeasible):
            # A grant can be preempted or revoked while it is being placed (a busy caller may
            # take longer than the grace): then the group vanishes under the probes, and the
            # broker's reason is what the caller should see, not Ray's.
            taken = self._taken_back(broker)
            if taken is not None:
                raise taken from None
            raise

    def _taken_back(self, broker) -> GPUSessionError | None:
        try:
            view = client.call(broker.wait, self.lease_id, -1, 0.0, auth=client.lease_auth(self.identity))
        except Exception:  # the broker is away: the original error stands
            return None
        if view.get("notice") or view["state"] == LeaseState.ENDED:
            return notice_error(self, Notice.from_view(view))
        return None

    def _place_group(self, broker, view: dict) -> None:
        self._pg_name = view["pg_name"]
        self.avoid_nodes(view.get("avoid_nodes"))
        self._create_group()
        client.call(broker.placed, self.lease_id, self.node_workers(), gpu_ids=self.gpu_ids(),
                    auth=client.lease_auth(self.identity))
        self._watch = NoticeWatch(self.lease_id, self.identity)

    def _create_group(self, keep: list[WorkerHandle] = (), on: list[str] | None = None) -> None:
        """A placement group of `self.size` bundles under the lease's name (`on`: bundle i on node
        on[i], where the broker holds GPUs for it); its workers (those in `keep` first, on their
        nodes, in order) and slots."""
        lease = self.options.lease
        started = time.monotonic()
        self._pg = placement_group(
            [{"GPU": lease.gpus_per_worker}] * self.size,
            strategy=lease.placement.ray_strategy,
            name=self._pg_name,
            bundle_label_selector=self._bundle_nodes(on),
        )
        try:
            ray.get(self._pg.ready(), timeout=PLACE_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            raise Infeasible(messages.not_placed(self.gpus, PLACE_TIMEOUT_S, _cluster_view(client.broker()))) from None
        # Workers start (or come warm from the pool) while the probes run: a first call pays
        # one process start, not two in a row.
        bundle_nodes = ray.util.placement_group_table(self._pg)["bundles_to_node_id"]
        self.crew.assign([bundle_nodes[i] for i in range(self.size)], list(keep))
        placed = time.monotonic()
        self.slots = self._probe_slots()
        log.debug("Lease %s: group of %d placed in %.2f s, probed in %.2f s", self.lease_id, self.size,
                  placed - started, time.monotonic() - placed)
        logical_nodes = {n.node_id for n in raycluster.nodes() if n.logical}
        self.logical_gpus = all(slot.node_id in logical_nodes for slot in self.slots)
        self.info.logical_gpus = self.logical_gpus
        self.info.nodes = sorted({slot.address for slot in self.slots})

    def drop_group(self) -> None:
        """Remove the placement group now, as Ray does when the process that made it dies: its
        workers stop by themselves and the broker closes the lease's row. For a run hosted for a
        kernel that died while the run could not notice (gateway/hosted.py); its own release follows."""
        group = self._pg
        if group is not None:
            remove_placement_group(group)

    def avoid_nodes(self, nodes) -> None:
        """The hosts the broker knows lost as it grants GPUs (or offers more): the next group of
        this lease is placed on none of them."""
        self._avoided = set(nodes or ())

    def _bundle_nodes(self, on: list[str] | None) -> list[dict] | None:
        if on is not None:
            return [{raycluster.NODE_ID_LABEL: node} for node in on]
        avoid = self._lost_nodes | self._avoided
        if avoid:
            # Never on a lost host: Ray still lists it as alive for seconds to a minute, may place
            # a bundle there, and that bundle's worker would wait until Ray gives up on the host.
            return [{raycluster.NODE_ID_LABEL: f"!in({','.join(sorted(avoid))})"}] * self.size
        return None

    def _probe_slots(self) -> list[Slot]:
        return probe_slots(self._pg, self.size, self.options.lease.gpus_per_worker, lease_id=self.lease_id)

    # ----- during runs ----------------------------------------------------------------------------
    @property
    def watch_ref(self):
        return self._watch.ref if self._watch is not None else None

    @property
    def has_notice(self) -> bool:
        """A notice came and was parsed (the run's follower then stops waiting on the watch)."""
        return self._watch is not None and self._watch.notice is not None

    @property
    def group_id(self) -> str | None:
        return self._pg.id.hex() if self._pg is not None else None

    def notice(self, *, wait: bool = False) -> Notice | None:
        """The broker's notice (preempt, revoke, shrink, grow) if one arrived (wait: until one does)."""
        return self._watch.take(wait=wait) if self._watch is not None else None

    def rearm(self) -> None:
        """Watch for the next notice (after a resize was made, or an offer to grow lapsed)."""
        self._watch.rearm()

    def acquire_workers(self) -> list[WorkerHandle]:
        """The crew, ready; the broker hears who they are (it stops them if it takes the lease back)."""
        if self.crew.make_ready([slot.node_id for slot in self.slots]):
            client.call(client.broker().placed, self.lease_id, {}, [w.actor for w in self.crew.handles],
                        auth=client.lease_auth(self.identity))
        return self.crew.handles

    def drop_workers(self, handles: list[WorkerHandle], *, lost_nodes: set[str]) -> None:
        """Workers of a lost host leave the lease now: stopping ranks, cleaning up and releasing
        never wait on them, nor on their host's GPUs (Ray frees those when it declares the host
        dead, long after)."""
        self.crew.drop(handles)
        self._lost_nodes |= set(lost_nodes)

    def change_size(self, workers: int) -> None:
        """Re-make the lease's group with `workers` bundles: a placement group cannot shrink or
        grow, so the old one is removed (waiting until Ray shows its GPUs free) and a new one made
        under the same name. The worker actors stay (those no longer needed go back to the pool)."""
        keep = self.crew.take()
        self._remove_group_and_wait()
        now = time.time()
        self._gpu_seconds_before += self.gpus * (now - (self._sized_at or now))
        self.size, self._sized_at = workers, now
        self._create_group(keep)
        self.info.nodes = sorted({slot.address for slot in self.slots})

    def node_workers(self) -> dict[str, int]:
        return dict(collections.Counter(slot.node_id for slot in self.slots))

    def gpu_ids(self) -> dict[str, list[list[str]]]:
        """Per node, the GPU ids of each worker there (the broker checks them against the grant)."""
        return {node: [list(s.gpu_ids) for s in self.slots if s.node_id == node] for node in self.node_workers()}

    def move_off_lost_hosts(self) -> str | None:
        """After a host was lost under a run that restarts at its size: the broker moves the lost
        hosts' workers to GPUs free now on other hosts, and holds them for this lease (or says
        why it cannot: returned, nothing changed); the group is re-made exactly there, with the
        surviving workers kept warm, and the broker told its GPU ids. Never waits for Ray to
        declare the host dead."""
        lost = sorted({slot.node_id for slot in self.slots} & self._lost_nodes)
        auth = client.lease_auth(self.identity)
        answer = client.call(client.broker().relocate, self.lease_id, lost, auth=auth)
        if not answer["moved"]:
            return answer["why"]
        placed = answer["node_workers"]
        order = list(dict.fromkeys(slot.node_id for slot in self.slots if slot.node_id in placed))
        order += sorted(node for node in placed if node not in order)  # rank 0's host stays first
        keep = self.crew.take()
        remove_placement_group(self._pg)  # its GPUs stay this lease's in the broker's books
        self._create_group(keep, on=[node for node in order for _ in range(placed[node])])
        client.call(client.broker().relocated, self.lease_id, self.node_workers(), gpu_ids=self.gpu_ids(), auth=auth)
        return None

    def reprobe_slots(self) -> None:
        """Find where the group's bundles are now (after a worker was lost); the broker is told
        if Ray moved one meanwhile."""
        before = (self.node_workers(), self.gpu_ids())
        self.slots = self._probe_slots()
        if (self.node_workers(), self.gpu_ids()) != before:
            client.call(client.broker().resize, self.lease_id, self.size, self.node_workers(),
                        gpu_ids=self.gpu_ids(), auth=client.lease_auth(self.identity))
        self.info.nodes = sorted({slot.address for slot in self.slots})

    # ----- releasing ------------------------------------------------------------------------------
    def _remove_group_and_wait(self) -> None:
        """Remove the group, then wait (bounded) until Ray's own view shows its GPUs free, before
        the broker hears of it: so no other lease can be placed on them before the view says so."""
        ours: dict[str, float] = collections.Counter()
        for slot in self.slots:
            if slot.node_id not in self._lost_nodes:  # a lost host's GPUs come back only when Ray says so
                ours[slot.node_id] += self.options.lease.gpus_per_worker
        remove_group_and_wait(self._pg, ours, lease_id=self.lease_id)

    def _release(self, reason: str) -> None:
        self.crew.clean_up(self.lease_id)
        released = time.time()
        told = self.lease_id is None
        try:
            if self._pg is not None:
                self._remove_group_and_wait()
            if self.lease_id is not None:
                try:
                    client.call(client.broker().release, self.lease_id, reason,
                                auth=client.lease_auth(self.identity), timeout=10.0)
                    told = True
                except Exception as exc:  # Ray already freed the group; the broker reconciles later
                    log.warning("Could not tell the broker lease %s ended (%s); it will notice by itself.",
                                self.lease_id, exc)
        finally:
            # Only now may another lease of this process take the workers: until the broker heard
            # the end, it could take this lease back and kill the workers it knows as this lease's.
            self.crew.give_back(broker_told=told)
        if self.granted_at is not None and self.slots:  # as the broker bills: only a lease Ray placed
            self.info.gpu_seconds = self._gpu_seconds_before + self.gpus * (released - (self._sized_at or released))
        self.info.released = True
        held.discard(self)


def _cluster_view(broker) -> dict | None:
    """The broker's view of the nodes (which are lost, GPUs used outside gpusession), or None."""
    try:
        return client.call(broker.cluster, timeout=10.0)
    except Exception:  # the broker is away: the message says so
        return None
