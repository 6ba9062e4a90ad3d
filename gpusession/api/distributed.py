"""`@gs.distributed`: lease GPUs for exactly one call, run it data-parallel, release, return."""
from __future__ import annotations

import functools
import inspect
import threading
from typing import Any, Callable

from ..errors import GPUSessionError
from ..observe.events import Fanout, RunInfo
from ..observe.renderer import default_observer
from ..run.caller.stepreport import StepToBroker
from .background import Run
from ..run.endings import told_when_ended
from ..gateway.client import gateway_path
from ..gateway.keeping import Detach
from ..gateway.remote import RemoteCheckpoint
from ..run.caller.options import RunOptions, validate_run_options

OPTION_NAMES = tuple(inspect.signature(validate_run_options).parameters)


def parse_options(options: dict, *, where: str) -> RunOptions:
    unknown = sorted(set(options) - set(OPTION_NAMES))
    if unknown:
        raise TypeError(f"{where} got an unknown option {unknown[0]!r}; the options are {', '.join(OPTION_NAMES)}.")
    return validate_run_options(**options)


class DistributedFunction:
    """A function that runs on leased GPUs each time it is called. See `gs.distributed`."""

    def __init__(self, fn: Callable, options: RunOptions, *, observer: Any = None) -> None:
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.options = options
        self.observer = observer  # an events.Observer; None: the default renderer (a sweep's trial has its own)
        # The latest call, (RunInfo, (args, kwargs)), per thread and of any thread (see last_run).
        self._mine = threading.local()
        self._anyone: tuple[RunInfo, tuple[tuple, dict]] | None = None

    @property
    def last_run(self) -> RunInfo | None:
        """The RunInfo of the latest call this thread made (a submit() counts for the thread that
        submitted); in a thread that made none, of the latest call any thread made. Per thread so
        that blocking calls from several threads each see their own run, and resume() continues
        its own thread's, never whichever call started last."""
        latest = self._latest()
        return latest[0] if latest is not None else None

    def _latest(self) -> tuple[RunInfo, tuple[tuple, dict]] | None:
        return getattr(self._mine, "latest", None) or self._anyone

    def _note(self, info: RunInfo, call: tuple[tuple, dict]) -> None:
        self._mine.latest = self._anyone = (info, call)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._run(args, kwargs, checkpoint_ref=None)

    def submit(self, *args: Any, detach: bool = False, max_duration: float | None = None, **kwargs: Any) -> Run:
        """Start the call in the background and return its `Run` at once (its own lease, within
        your quota; queued behind others if the GPUs are busy). In a notebook the run's live view
        stays in the cell that submitted it. `run.result()` waits and returns the value (or
        raises the error the blocking call would); `run.cancel()` stops it; `gs.runs()` lists them.

        detach=True: a gpusession gateway hosts the run past this kernel (a restart, a crash, the
        server stopped) for at most `max_duration` seconds (default: the admin's, 24 h out of the box; then it is stopped and
        its GPUs released): the hub's, or with `gpusession lab` / RAY_ADDRESS a gateway of your own
        that the first detach starts; `run.run_id` is what `gs.attach` takes in any kernel of yours.
        Not with the embedded cluster, which ends with this kernel. `detach` and `max_duration`
        are submit()'s own: not passed to the function."""
        if not detach:
            if max_duration is not None:
                raise TypeError("submit(max_duration=...) is the time limit of a detached run: pass detach=True too.")
            return self.start_background(args, kwargs)
        from .detached import detach_limit

        return self.start_background(args, kwargs, detach=detach_limit(max_duration))

    def start_background(self, args: tuple, kwargs: dict, *, handle: type[Run] = Run, detach: Detach | None = None,
                         **extra: Any) -> Run:
        """submit() with the handle's class chosen (a %%gpu --bg cell's handle can pull());
        detach: a run the gateway hosts past this kernel, with its time limit."""
        observer = self.observer or default_observer(self.options.lease.workers, background=True)
        taken: list = []  # the handle, told the run's id once the gateway took it

        def start(run_observer, info: RunInfo) -> Any:
            return self._run(args, kwargs, checkpoint_ref=None, observer=run_observer, info=info,
                             detach=detach, on_detached=getattr(taken[0], "_noted", None) if detach is not None else None)

        if detach is not None and handle is Run:
            from .detached import DetachedRun

            handle = DetachedRun
        run = handle(self.__name__, start, observer, **extra)
        taken.append(run)
        run._begin()
        self._note(run.info, (args, kwargs))
        return run

    def resume(self, *args: Any, **kwargs: Any) -> Any:
        """Run again from `last_run.checkpoint` (what gs.load_checkpoint() returns); with no
        arguments, the last call's arguments are used."""
        latest = self._latest()  # read once: another thread's call may start meanwhile
        if latest is None or latest[0].checkpoint_ref is None:
            raise GPUSessionError(
                f"{self.__name__}.resume() needs a checkpoint, but the last run saved none "
                "(call gs.save_checkpoint(...) inside the function)."
            )
        last, call = latest
        if not args and not kwargs:
            args, kwargs = call
        return self._run(args, kwargs, checkpoint_ref=last.checkpoint_ref, checkpoint_step=last.checkpoint_step)

    def _run(self, args: tuple, kwargs: dict, *, checkpoint_ref, checkpoint_step=None,
             observer: Any = None, info: RunInfo | None = None, detach: Detach | None = None,
             on_detached: Any = None) -> Any:
        info = info if info is not None else RunInfo()
        self._note(info, (args, kwargs))
        observer = observer or self.observer or default_observer(self.options.lease.workers)
        # a hub kernel (no Ray here): the service's gateway hosts every run. Elsewhere a detached run
        # (or a resume from a checkpoint a gateway holds) goes to this user's own gateway; the rest runs here.
        if gateway_path() or detach is not None or isinstance(checkpoint_ref, RemoteCheckpoint):
            return self._run_through_gateway(args, kwargs, observer=observer, info=info,
                                             checkpoint_ref=checkpoint_ref, checkpoint_step=checkpoint_step,
                                             detach=detach, on_detached=on_detached)
        from ..run.caller.lease import Lease
        from ..run.bulk import ship
        from ..run.caller.controller import run_function

        # beside the cell's renderer: the live step for JupyterLab's sidebar (gpusession.run.caller.stepreport)
        observer = Fanout(observer, StepToBroker())
        with told_when_ended(info, observer):
            # pickled and put in the object store before any GPU is asked for: a call that cannot
            # be shipped (an unpicklable function, data too big for the store) queues for none
            shipped = []
            with Lease(self.options, observer=observer, info=info).acquire(
                    before_request=lambda: shipped.append(ship(self.fn, args, kwargs))) as lease:
                return run_function(lease, self.fn, args, kwargs, info=info, observer=observer,
                                    checkpoint_ref=checkpoint_ref, checkpoint_step=checkpoint_step,
                                    shipment=shipped[0])

    def _run_through_gateway(self, args: tuple, kwargs: dict, *, observer, info: RunInfo,
                             checkpoint_ref, checkpoint_step, detach: Detach | None = None,
                             on_detached: Any = None) -> Any:
        """The same call, run by the one run path in the gateway (gateway/remote.py); the gateway
        tells the broker the live step, so no StepToBroker here."""
        from ..gateway.remote import run_remote

        with told_when_ended(info, observer):
            return run_remote(self.fn, args, kwargs, self.options, info=info, observer=observer,
                              checkpoint_ref=checkpoint_ref, checkpoint_step=checkpoint_step, name=self.__name__,
                              detach=detach, on_detached=on_detached)

    def __repr__(self) -> str:
        lease = self.options.lease
        return f"<gpusession.distributed {self.__name__}: {lease.gpus:g} GPUs, {lease.workers} workers>"


def distributed(fn: Callable | None = None, /, **options: Any):
    """Run the decorated function on `gpus` leased GPUs, data-parallel, only while it runs.

    In [1]: @gs.distributed(gpus=2)
       ...: def train(lr):
       ...:     model = gs.prepare_model(torch.nn.Linear(10, 1))
       ...:     ...
       ...:     return gs.unwrap(model).state_dict()
    In [2]: state = train(0.1)      # waits for 2 GPUs, runs on 2 workers, releases, returns

    Options (keyword only): gpus, gpus_per_worker, min_gpus, priority, timeout, queue_timeout,
    backend, placement, max_failures, return_all, runtime_env, and what gs.prepare_model applies:
    grad_compression (None, "fp16", "bf16", "powersgd", or gs.PowerSGD(rank=4, warmup_steps=20)
    for PowerSGD's settings; "powersgd" is rank 2 after 10 plain steps), bucket_mb, precision (None, "bf16",
    "fp16"; see gpusession/run/comm_options.py). Bad options raise here, before anything is leased."""
    run_options = parse_options(options, where="gs.distributed()")

    def wrap(function: Callable) -> DistributedFunction:
        if not callable(function):
            raise TypeError(f"gs.distributed decorates a function; got {type(function).__name__}.")
        return DistributedFunction(function, run_options)

    return wrap(fn) if fn is not None else wrap
