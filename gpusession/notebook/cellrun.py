"""A %%gpu cell as a function the workers run: its inputs go in, rank 0's names come back.

Both directions are one cloudpickle of a dict, so objects that share state stay shared (an
optimizer keeps pointing at its model's parameters). Modules travel as their import name and
are imported again on the other side. A value that cannot be pickled is left out and named,
rather than failing the whole cell.
"""
from __future__ import annotations

import builtins
import collections
import importlib
import linecache
import sys
import types
from dataclasses import dataclass, field
from typing import Any

import cloudpickle

from .cellcode import split_last_expression
from ..run.shipping import cloudpickle_dumps, pickled_by_value


@dataclass(frozen=True)
class ModuleRef:
    """A module, shipped as the name to import it by."""

    name: str


@dataclass
class Packed:
    data: bytes
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (name, why it was left out)


@dataclass(frozen=True)
class CellPayload:
    source: str
    filename: str
    inputs: bytes  # a Packed dict of the notebook values the body reads
    wanted: tuple[str, ...]  # names rank 0 sends back, when the body left them defined


@dataclass
class CellResult:
    values: Packed  # {name: value} from rank 0's namespace, on the CPU
    value: Packed | None  # {"value": the last expression} when the body ends with one
    value_text: str | None = None  # repr of the last expression, if it could not be pickled


def pack(values: dict[str, Any], *, by_value: tuple = ()) -> Packed:
    """Pickle values together; on failure find the culprits, name them, and pickle the rest.
    by_value: modules whose functions and classes travel as code (the notebook's own files)."""
    plain = {name: _module_to_ref(value) for name, value in values.items()}
    with pickled_by_value(by_value):
        try:
            return Packed(cloudpickle_dumps(plain))
        except Exception:
            skipped = [(name, why) for name, value in plain.items() if (why := _unpicklable(value))]
            kept = {name: value for name, value in plain.items() if name not in dict(skipped)}
            return Packed(cloudpickle_dumps(kept), skipped)


def unpack(packed: Packed) -> dict[str, Any]:
    """Raises ImportError when a module shipped by name cannot be imported here."""
    values = cloudpickle.loads(packed.data)
    return {name: _ref_to_module(value) for name, value in values.items()}


def _module_to_ref(value: Any) -> Any:
    return ModuleRef(value.__name__) if isinstance(value, types.ModuleType) else value


def _ref_to_module(value: Any) -> Any:
    return importlib.import_module(value.name) if isinstance(value, ModuleRef) else value


def _unpicklable(value: Any) -> str | None:
    try:
        cloudpickle_dumps(value)
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}".rstrip(": ")
    return None


# ----- on the worker ------------------------------------------------------------------------------
def run_cell(payload: CellPayload) -> CellResult | None:
    """Runs the body as a notebook cell would, in a fresh namespace holding the shipped inputs.
    Every rank runs it; only rank 0 packs what comes back."""
    from ..run.rank.context import context

    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
    namespace.update(unpack(Packed(payload.inputs)))
    body, last = split_last_expression(payload.source, payload.filename)
    # tracebacks of the cell then show its source lines, as a local cell's do
    linecache.cache[payload.filename] = (len(payload.source), None,
                                         payload.source.splitlines(True), payload.filename)
    exec(compile(body, payload.filename, "exec"), namespace)
    value = eval(compile(last, payload.filename, "eval"), namespace) if last is not None else None
    if context().rank != 0:
        return None
    memo: dict[int, Any] = {}
    values = {name: to_cpu(namespace[name], memo) for name in payload.wanted if name in namespace}
    result = CellResult(values=pack(values), value=None)
    if value is not None:
        result.value = pack({"value": to_cpu(value, memo)})
        if result.value.skipped:
            result.value, result.value_text = None, _safe_repr(value)
    return result


def to_cpu(value: Any, memo: dict[int, Any] | None = None) -> Any:
    """Tensors, modules (DDP unwrapped) and optimizer state moved to the CPU, inside lists,
    tuples and dicts too (a state_dict of CUDA tensors could not be loaded in a CPU notebook).
    memo keeps one object converted once, so names that shared it still share it."""
    torch = sys.modules.get("torch")
    if torch is None:
        return value
    memo = {} if memo is None else memo
    if id(value) in memo:
        return memo[id(value)]
    if isinstance(value, torch.nn.Module):
        from ..run.rank.context import unwrap

        converted = unwrap(value).to("cpu")  # in place: parameters keep their identity
    elif isinstance(value, torch.Tensor):
        converted = _tensor_to_cpu(value)
    elif isinstance(value, torch.optim.Optimizer):
        for state in value.state.values():
            for key, item in state.items():
                if isinstance(item, torch.Tensor):
                    state[key] = item.cpu()
        converted = value
    elif isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        converted = type(value)(to_cpu(item, memo) for item in value)
    elif type(value) in (dict, collections.OrderedDict):
        converted = type(value)((key, to_cpu(item, memo)) for key, item in value.items())
        if hasattr(value, "_metadata"):  # a state_dict's versions, which load_state_dict reads
            converted._metadata = value._metadata
    else:
        converted = value
    memo[id(value)] = converted
    return converted


def _tensor_to_cpu(tensor):
    if tensor.device.type == "cpu" and (tensor.is_leaf or not tensor.requires_grad):
        return tensor
    moved = tensor.detach().cpu()  # a non-leaf tensor with a graph cannot be pickled
    if tensor.is_leaf and tensor.requires_grad:
        moved.requires_grad_()
    return moved


def _safe_repr(value: Any) -> str:
    try:
        return repr(value)
    except Exception as exc:
        return f"<{type(value).__name__} object (repr failed: {exc})>"
