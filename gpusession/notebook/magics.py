"""`%%gpu` and `%gpu`: thin magics that parse their flags, then make one call.

A %%gpu cell becomes `run_cell(payload)` run through `DistributedFunction`, so leasing, the live
display, release, errors and checkpoints are exactly those of `@gs.distributed`.
"""
from __future__ import annotations

import argparse
import sys
import threading
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, kwds, magic_arguments, parse_argstring

from .cellcode import CellCode, analyze, parse_names
from .bgcell import CellRun, DetachedCellRun
from .cellrun import CellPayload, CellResult, pack, run_cell, unpack
from ..api.distributed import DistributedFunction, parse_options
from ..run.comm_options import grad_compression_flag_value
from ..errors import GPUSessionError
from ..gateway.keeping import Detach
from ..broker.policy.messages import gpus_text
from ..run.caller.options import parse_duration
from ..run.shipping import local_modules

MAGIC_SYNTAX = ("The %%gpu body uses IPython syntax (%magic, !command or ?), which the workers cannot "
                "run. Move those lines to a cell of their own.")
DEFAULT_HANDLE = "_run"  # a %%gpu --bg cell's handle when -o is not given
BOTH_OUT_FLAGS = "--out and --no-out contradict each other: use --out a,b to choose names, or --no-out for none."


def _gpu_count(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of GPUs; write e.g. %%gpu 2") from None
    return int(value) if value.is_integer() else value


def _duration(text: str) -> float:
    try:
        return parse_duration(text, field_name="time")
    except (ValueError, TypeError):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a time: write seconds (90) or 90s, 10m, 2h; it must be more than 0") from None


def _names(text: str) -> tuple[str, ...]:
    try:
        return parse_names(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def grad_compression_flag(text: str):
    """--grad-compression's argparse type: a wrong value is a usage error naming the choices."""
    try:
        return grad_compression_flag_value(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


@magics_class
class GPUMagics(Magics):
    @magic_arguments(name="%gpu")
    @kwds(usage="%(prog)s [N] [--min N] [--priority P] [--timeout T] [--queue-timeout T] [--out a,b] [--no-out] "
                "[--grad-compression C] [--bucket-mb MB] [--precision P] [--bg [-o NAME] [--detach [--max-duration T]]]")
    @argument("gpus", nargs="?", default=1, type=_gpu_count, metavar="N",
              help="GPUs to lease for this cell, one worker per GPU (default 1).")
    @argument("--min", dest="min_gpus", type=_gpu_count, metavar="N",
              help="Elastic lower bound (default: the GPUs asked for, not elastic). With N below them, "
                   "a preemption shrinks the run to as few as N GPUs and it grows back when GPUs free up; "
                   "it changes size at its next gs.save_checkpoint.")
    @argument("--priority", choices=("low", "normal", "high"), default="normal",
              help="Queue priority: low, normal (default) or high; capped by your quota's max_priority.")
    @argument("--timeout", type=_duration, metavar="T",
              help="Stop the run after T (seconds, or 90s, 10m, 2h) and release the GPUs. Default: no limit.")
    @argument("--queue-timeout", type=_duration, metavar="T",
              help="Give up with QueueTimeout if no GPUs are granted within T. Default: wait as long as it takes.")
    @argument("--out", type=_names, metavar="a,b",
              help="Bring back only these names from rank 0 (default: every name the cell assigns, "
                   "plus the models and optimizers it received).")
    @argument("--no-out", action="store_true",
              help="Bring no names back; the last expression is still displayed.")
    @argument("--bg", action="store_true",
              help="Run in the background: the cell returns at once and keeps its live view; the "
                   "notebook stays usable. NAME.pull() assigns the cell's names when it is done.")
    @argument("-o", dest="handle", metavar="NAME",
              help="With --bg: the name the run's handle gets in the notebook (default: _run).")
    @argument("--detach", action="store_true",
              help="With --bg: a gpusession gateway hosts the run past this kernel (a restart, a crash, the "
                   "server stopped): the hub's, or with `gpusession lab` / RAY_ADDRESS your own; NAME.run_id is "
                   "what gs.attach(run_id) takes in any kernel of yours. Not with the embedded cluster.")
    @argument("--max-duration", type=_duration, metavar="T",
              help="With --detach: stop the detached run after T (seconds, or 90s, 10m, 2h) and release its "
                   "GPUs. Default: 24h.")
    @argument("--grad-compression", type=grad_compression_flag, metavar="C",
              help="Compress the gradients gs.prepare_model's DDP all-reduces: fp16 or bf16 (half the bytes) "
                   "or powersgd (rank 2, after 10 plain steps); powersgd:rank=4,warmup=20 chooses PowerSGD's "
                   "rank and plain steps. Default: fp32, as DDP. Helps on slow links only.")
    @argument("--bucket-mb", type=float, metavar="MB",
              help="DDP's gradient bucket size in MB (bucket_cap_mb), e.g. 50. Default: DDP's 25.")
    @argument("--precision", choices=("bf16", "fp16"), metavar="P",
              help="Run the forward pass of gs.prepare_model's model under autocast in bf16 or fp16 (fp16 "
                   "also scales the loss in gs.step). Default: fp32.")
    @cell_magic("gpu")
    def gpu_cell(self, line: str, cell: str) -> Any:
        """
        Run this cell's body on N leased GPUs, data-parallel; the GPUs are released when it ends.

        Names the body reads from the notebook are sent to the workers (modules are imported there
        by name); names it assigns come back from rank 0 (tensors on the CPU), and so do models and
        optimizers it received and trained in place (DDP unwrapped). Rank 0's last expression is the
        cell's result; `_gpu` holds the run's RunInfo (times, GPU-seconds, gs.report history).
        Output and gs.report metrics appear live; the stop button stops every worker.

        After `%load_ext gpusession` and `import torch, gpusession as gs`:

            In [1]: %%gpu 2 --timeout 10m
               ...: model = gs.prepare_model(torch.nn.Linear(10, 1))
               ...: opt = torch.optim.SGD(model.parameters(), lr=0.1)
               ...: for step in range(100):
               ...:     loss = model(torch.randn(32, 10)).pow(2).mean()
               ...:     opt.zero_grad(); loss.backward(); opt.step()
               ...:     gs.report(step=step, loss=loss)
               ...: print("done")
               ...: loss.item()
            done · 2 GPUs · queued 0.0 s · setup 0.4 s · run 3.1 s · 7.2 GPU·s · released
            [rank 0] done
            [rank 1] done
            Out[1]: 0.0123

            In [2]: model          # rank 0's trained model: the plain Linear, on the CPU
            Out[2]: Linear(in_features=10, out_features=1, bias=True)

            In [3]: _gpu.gpu_seconds
            Out[3]: 7.2
        """
        args = parse_argstring(self.gpu_cell, line)
        return run_gpu_cell(self.shell, cell, args)

    @magic_arguments(name="gpu")
    @argument("action", choices=("status", "release", "attach"),
              help="status: cluster capacity, your quota and usage, this kernel's leases. "
                   "release: give back every lease this kernel still holds (from gs.lease blocks). "
                   "attach ID [-o NAME]: follow your detached run ID from this kernel.")
    @argument("run_id", nargs="?", metavar="ID",
              help="With attach: the detached run's id, as gs.runs(all=True) lists it.")
    @argument("-o", dest="handle", metavar="NAME",
              help="With attach: the name its handle gets in the notebook (default: _run); NAME.pull() "
                   "assigns a cell run's names.")
    @line_magic("gpu")
    def gpu_line(self, line: str) -> None:
        """
        Look at or give back this kernel's GPUs.

            In [1]: with_gpus = gs.lease(gpus=1)   # held until released
            In [2]: %gpu status
            cluster: 4 GPUs · 1 leased · 3 free · 0 queued
            alice: 1 GPUs in use (max 2) · 0.12 of 10 h GPU-hours in 7 days · max priority normal
              lease 7: 1 GPUs, normal, placed, 42 s
            leases held by this kernel (gs.lease blocks):
              <gpusession.Lease 7: 1 GPUs, 1 workers, held>
            In [3]: %gpu release
            Released 1 lease of this kernel (1 GPUs); Ray shows them free.
            In [4]: %gpu attach 3f2a9c... -o r1        # a detached run of yours
            gpusession: r1 follows the detached run 3f2a9c... (train); r1.result() or r1.pull().
        """
        args = parse_argstring(self.gpu_line, line)
        if args.action == "attach":
            print(attach_run(self.shell, args.run_id, args.handle))
            return
        if args.run_id is not None or args.handle is not None:
            raise UsageError(f"%gpu {args.action} takes no ID or -o NAME (those are for %gpu attach ID -o NAME).")
        print(show_status() if args.action == "status" else release_kernel_leases())


def load_ipython_extension(ipython) -> None:
    ipython.register_magics(GPUMagics)
    warm_up()


def warm_up() -> None:
    """What the first %%gpu cell would otherwise pay before its status line shows: finding the
    installed packages (~0.5 s, cached) to tell the user's own modules from libraries."""
    from ..run.shipping import installed_top_level_names

    threading.Thread(target=installed_top_level_names, name="gpusession-warm-up", daemon=True).start()


# ----- %gpu ------------------------------------------------------------------------------------------
def show_status() -> str:
    from ..api.status import status
    from ..run.caller.holding import held_leases

    held = held_leases()
    mine = "\n".join(f"  {lease!r}" for lease in held) or "  (none)"
    return f"{status()}\nleases held by this kernel (gs.lease blocks):\n{mine}"


def release_kernel_leases() -> str:
    from ..run.caller.holding import held_leases, release_all

    gpus = sum(lease.gpus for lease in held_leases())
    count = release_all("released")
    if not count:
        return "This kernel holds no leases: nothing to release."
    leases = f"{count} lease{'s' if count != 1 else ''}"
    return f"Released {leases} of this kernel ({gpus_text(gpus)}); Ray shows them free."


# ----- %%gpu -----------------------------------------------------------------------------------------
def run_gpu_cell(shell, cell: str, args: argparse.Namespace) -> Any:
    """Check everything (nothing is leased on a mistake), run the body, bring its names back."""
    options = _run_options(args)
    # IPython has already counted this cell when it runs it: In[n] is one less
    filename = f"<%%gpu cell In[{max(1, shell.execution_count - 1)}]>"
    code = _analyze(shell, cell, filename)
    wanted = wanted_names(shell.user_ns, code, out=args.out, no_out=args.no_out)
    handle_name = _handle_name(args)
    detach = _detach_limit(args)
    _status_now(options)  # the cell is valid: its status line shows before the inputs are packed
    inputs = _gather_inputs(shell, code)
    function = DistributedFunction(run_cell, options)
    if args.bg:
        run = function.start_background((CellPayload(code.source, filename, inputs, wanted),), {},
                                        handle=CellRun if detach is None else DetachedCellRun, detach=detach,
                                        shell=shell, handle_name=handle_name, wanted=wanted,
                                        bring_back=_bring_back)
        shell.user_ns[handle_name] = run
        return None
    try:
        result = function(CellPayload(code.source, filename, inputs, wanted))
    except (GPUSessionError, KeyboardInterrupt) as exc:
        _show_without_internals(exc, function.last_run)
        raise
    finally:
        shell.user_ns["_gpu"] = function.last_run  # kept on failure too: history, checkpoint
    return _bring_back(shell.user_ns, result)


def attach_run(shell, run_id: str | None, handle: str | None) -> str:
    """`%gpu attach ID [-o NAME]`: NAME (default _run) is the detached run's handle in this kernel
    (a cell's run: NAME.pull() assigns its names)."""
    if not run_id:
        raise UsageError("%gpu attach needs the run's id: %gpu attach ID -o NAME (gs.runs(all=True) lists yours).")
    name = handle or DEFAULT_HANDLE
    if not name.isidentifier():
        raise UsageError(f"-o {name!r} is not a Python name; write e.g. -o run1.")
    from ..api.detached import attach

    try:
        run = attach(run_id, handle=DetachedCellRun, shell=shell, handle_name=name, wanted=(), bring_back=_bring_back)
    except GPUSessionError as exc:
        raise UsageError(str(exc)) from None
    shell.user_ns[name] = run
    return f"gpusession: {name} follows the detached run {run.run_id} ({run.name}); {name}.result() or {name}.pull()."


def _handle_name(args: argparse.Namespace) -> str:
    if args.handle is not None and not args.bg:
        raise UsageError("-o NAME names a background run's handle: use it with --bg (e.g. %%gpu 2 --bg -o run1).")
    name = args.handle or DEFAULT_HANDLE
    if not name.isidentifier():
        raise UsageError(f"-o {name!r} is not a Python name; write e.g. -o run1. Nothing was leased.")
    return name


def _detach_limit(args: argparse.Namespace) -> Detach | None:
    """How a --detach cell is detached (None: not detached); UsageError on a mistake."""
    if args.max_duration is not None and not args.detach:
        raise UsageError("--max-duration is the time limit of a detached run: use it with --bg --detach.")
    if not args.detach:
        return None
    if not args.bg:
        raise UsageError("--detach needs --bg (e.g. %%gpu 2 --bg --detach -o run1). Nothing was leased.")
    from ..api.detached import detach_limit

    try:
        return detach_limit(args.max_duration)
    except (GPUSessionError, ValueError) as exc:
        raise UsageError(f"{exc} Nothing was leased.") from None


def _status_now(options) -> None:
    from ..observe import events

    if events._factory is None and events._in_notebook_kernel():  # the default renderer will adopt it
        from ..observe.display import show_early

        show_early(options.lease.gpus, options.lease.workers)


def _run_options(args: argparse.Namespace):
    if args.out is not None and args.no_out:
        raise UsageError(BOTH_OUT_FLAGS)
    chosen = {"gpus": args.gpus, "min_gpus": args.min_gpus, "priority": args.priority,
              "timeout": args.timeout, "queue_timeout": args.queue_timeout,
              "grad_compression": args.grad_compression, "bucket_mb": args.bucket_mb, "precision": args.precision}
    try:
        return parse_options(chosen, where="%%gpu")
    except (ValueError, TypeError) as exc:
        raise UsageError(str(exc)) from None


def _analyze(shell, cell: str, filename: str) -> CellCode:
    source = shell.transform_cell(cell)
    try:
        code = analyze(source, filename)
    except SyntaxError as exc:
        where = f"line {exc.lineno}: {(exc.text or '').strip()}" if exc.lineno else "the body"
        raise UsageError(f"SyntaxError in the %%gpu body, {where} ({exc.msg}). Nothing was leased.") from None
    if "get_ipython" in code.reads and "get_ipython" not in cell:
        raise UsageError(MAGIC_SYNTAX)
    return code


def _trained_in_place(value: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, (torch.nn.Module, torch.optim.Optimizer))


def wanted_names(namespace: dict, code: CellCode, *, out: tuple[str, ...] | None, no_out: bool) -> tuple[str, ...]:
    """The names rank 0 sends back: assigned ones, then received models and optimizers."""
    if no_out:
        return ()
    received = sorted(n for n in code.reads if n not in code.assigns and _trained_in_place(namespace.get(n)))
    candidates = code.assigns + tuple(received)
    if out is None:
        return candidates
    unknown = [name for name in out if name not in candidates]
    if unknown:
        raise UsageError(
            f"--out names {', '.join(unknown)}, which the cell neither assigns at top level nor receives as "
            f"a model or optimizer (it can bring back: {', '.join(candidates) or 'nothing'}). Nothing was leased."
        )
    return out


def _gather_inputs(shell, code: CellCode) -> bytes:
    namespace, hidden = shell.user_ns, shell.user_ns_hidden
    values = {name: namespace[name] for name in sorted(code.reads)
              if name in namespace and not (name in hidden and hidden[name] is namespace[name])}
    packed = pack(values, by_value=tuple(local_modules()))
    for name, why in packed.skipped:
        print(f"gpusession: {name!r} was not sent to the workers: it cannot be pickled ({why}).",
              file=sys.stderr)
    return packed.data


def _bring_back(namespace: dict, result: CellResult | None) -> Any:
    if result is None:
        return None
    for name, why in result.values.skipped:
        print(f"gpusession: {name!r} was not brought back: it cannot be pickled ({why}).", file=sys.stderr)
    try:
        namespace.update(unpack(result.values))
    except Exception as exc:
        print(f"gpusession: the cell's names could not be loaded here ({type(exc).__name__}: {exc}); "
              "nothing was brought back.", file=sys.stderr)
    if result.value is None:
        return _Shown(result.value_text) if result.value_text is not None else None
    try:
        return unpack(result.value)["value"]
    except Exception as exc:
        print(f"gpusession: the cell's result could not be loaded here ({type(exc).__name__}: {exc}).",
              file=sys.stderr)
        return None


def _show_without_internals(exc: BaseException, info) -> None:
    """IPython shows what `_render_traceback_` returns instead of a traceback (as it does for
    ipyparallel's remote errors): gpusession's own frames tell a notebook user nothing, while
    the message, with a failed rank's remote traceback, tells all."""
    message = str(exc) or (interrupted_message(info) if isinstance(exc, KeyboardInterrupt) else "")
    lines = [f"\x1b[31m{type(exc).__name__}\x1b[39m" + (f": {message}" if message else "")]
    exc._render_traceback_ = lambda: lines


def interrupted_message(info) -> str:
    if info is None or not info.gpus:
        return "the cell was stopped while it waited for GPUs; nothing was leased."
    return (f"the cell was stopped; every worker is gone and its {info.gpus:g} GPUs were released. "
            f"_gpu keeps the {len(info.history)} reports made so far.")


class _Shown:
    """Displays the repr of a result that could not be pickled back, as a local cell would."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text
