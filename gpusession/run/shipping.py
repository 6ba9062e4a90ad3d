"""Pickle a call for the workers, shipping code next to the caller by value.

Modules the user wrote beside the notebook (not installed, not from site-packages) are pickled
by value, so workers on any node get the caller's current code without setup, and a warm worker
never runs a stale copy of a module the user has since edited.
"""
from __future__ import annotations

import io
import os
import sys
import sysconfig
import threading
import types
from collections import ChainMap
from contextlib import contextmanager
from functools import lru_cache
from importlib import metadata
from typing import Any, Iterator

import cloudpickle


@lru_cache(maxsize=1)
def installed_top_level_names() -> frozenset[str]:
    """The top-level names of installed distributions, read once per process: reading every
    distribution's files takes ~0.4 s (a kernel warms it at %load_ext, a node's warm parent before
    it forks ranks, so no rank pays it to pickle its result)."""
    return frozenset(metadata.packages_distributions())


def _library_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    roots = {paths.get("purelib"), paths.get("platlib"), paths.get("stdlib"), sys.prefix, sys.base_prefix}
    return tuple(os.path.realpath(r) + os.sep for r in roots if r)


def _user_roots() -> tuple[str, ...]:
    roots = {os.getcwd()}
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    if main_file:
        roots.add(os.path.dirname(os.path.abspath(main_file)))
    return tuple(os.path.realpath(r) + os.sep for r in roots)


def is_user_file(file: str | None, user_roots: tuple[str, ...]) -> bool:
    """A file the user wrote: under one of their directories, not inside an interpreter's
    libraries (a virtualenv often lives inside the project directory)."""
    if not file:
        return False
    path = os.path.realpath(file)
    return path.startswith(user_roots) and not path.startswith(_library_roots())


_STDLIB_DIR = sysconfig.get_paths()["stdlib"] + os.sep


def _from_the_standard_library(name: str, module) -> bool:
    """A standard module, told without is_user_file's path checks (~0.1 ms each, ~150 such
    modules in a rank); a file of the user's that shadows one (a `code.py`) is not."""
    file = str(getattr(module, "__file__", None) or _STDLIB_DIR)
    return name in sys.stdlib_module_names and file.startswith(_STDLIB_DIR)


def local_modules() -> list:
    """Top-level modules and packages imported from the caller's own directory, and not installed
    from there (`pip install -e .`). The installed names are read only when a module is found in
    the user's folders: reading them costs a new process ~0.5 s, most of all a script's first call."""
    user_roots = _user_roots()
    found = [(name, module) for name, module in list(sys.modules.items())
             if "." not in name and name not in ("__main__", "gpusession")
             and not _from_the_standard_library(name, module)
             and is_user_file(getattr(module, "__file__", None), user_roots)]
    if not found:
        return []
    installed = installed_top_level_names()
    return [module for name, module in found if name not in installed]


_registry_lock = threading.RLock()  # cloudpickle's by-value registry is global to the process


@contextmanager
def pickled_by_value(modules) -> Iterator[None]:
    """Within the block, cloudpickle ships these modules' functions and classes as code.

    Held under one lock, so two calls from threads of one process do not undo each other's
    registrations; modules the user registered themselves stay registered."""
    with _registry_lock:
        added = [m for m in modules if not _registered(m)]
        for module in added:
            cloudpickle.register_pickle_by_value(module)
        try:
            yield
        finally:
            for module in added:
                cloudpickle.unregister_pickle_by_value(module)


def _registered(module) -> bool:
    return module.__name__ in cloudpickle.list_registry_pickle_by_value()


_CLOUDPICKLE_CODE_REDUCE = cloudpickle.Pickler.dispatch_table[types.CodeType]
_NO_FILE = "<dynamic-code>"  # what cloudpickle >= 3.1.3 writes in place of a code object's file


def _code_reduce_keeping_file(code: types.CodeType):
    """cloudpickle's reduction of a code object, with the object's own file name kept.

    cloudpickle 3.1.3 replaces the file name by "<dynamic-code>" so that payloads are
    deterministic; a worker's traceback then cannot show the user's source lines (a file beside
    the notebook, a cell's linecache entry), which is what a user reads first when a rank fails."""
    constructor, args = _CLOUDPICKLE_CODE_REDUCE(code)
    names = (code.co_name, getattr(code, "co_qualname", code.co_name))
    args = tuple(code.co_filename if isinstance(a, str) and a == _NO_FILE and a not in names else a
                 for a in args)
    return constructor, args


class _Pickler(cloudpickle.Pickler):
    dispatch_table = ChainMap({types.CodeType: _code_reduce_keeping_file}, cloudpickle.Pickler.dispatch_table)


def cloudpickle_dumps(obj: Any) -> bytes:
    """cloudpickle.dumps, with code objects keeping their file names (see _code_reduce_keeping_file)."""
    with io.BytesIO() as buffer:
        _Pickler(buffer, protocol=cloudpickle.DEFAULT_PROTOCOL).dump(obj)
        return buffer.getvalue()


def dumps(obj: Any) -> bytes:
    """cloudpickle, with the caller's own modules pickled by value (see the module docstring)."""
    with pickled_by_value(local_modules()):
        return cloudpickle_dumps(obj)


def dumps_with_buffers(obj: Any, buffer_callback, reducers: dict | None = None) -> bytes:
    """As dumps, with pickle protocol 5: each buffer (numpy's; CPU tensors' too with run/bulk.py's
    `reducers`) goes to buffer_callback, which keeps it out of the pickle by returning False
    (pickle's own contract)."""
    # the C pickler reads dispatch_table when it is made: the reducers go in a class of their own
    pickler_class = type("_BufferPickler", (_Pickler,), {"dispatch_table": ChainMap(reducers or {}, _Pickler.dispatch_table)})
    with pickled_by_value(local_modules()), io.BytesIO() as out:
        pickler_class(out, protocol=5, buffer_callback=buffer_callback).dump(obj)
        return out.getvalue()


NESTED_OBJECT_REF = (
    "An argument holds a Ray ObjectRef inside {where}: a rank is not a Ray worker and cannot fetch it. "
    "Pass the ObjectRef itself as an argument (the caller fetches it before the call) or ray.get() it first."
)


def call_arguments(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The arguments as the ranks get them: ObjectRef arguments are fetched here by the caller."""
    if "ray" in sys.modules:  # no ObjectRef can exist in a process that never imported ray
        return resolve_object_refs(args, kwargs)
    return args, kwargs


def resolve_object_refs(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Each ObjectRef argument becomes its value (as Ray does for a task's arguments); one held
    inside a list, dict or object is refused, as Ray would pass it on unresolved."""
    import ray

    def resolved(value: Any, where: str) -> Any:
        if isinstance(value, ray.ObjectRef):
            return ray.get(value)
        if _holds_object_ref(value, ray.ObjectRef):
            raise TypeError(NESTED_OBJECT_REF.format(where=where))
        return value

    return (tuple(resolved(a, f"argument {i}") for i, a in enumerate(args)),
            {k: resolved(v, f"argument {k!r}") for k, v in kwargs.items()})


def _holds_object_ref(value: Any, ref_type: type, depth: int = 0) -> bool:
    """An ObjectRef in plain containers (lists, tuples, sets, dict values), a few levels deep."""
    if isinstance(value, ref_type):
        return True
    if depth > 3:
        return False
    if isinstance(value, dict):
        return any(_holds_object_ref(v, ref_type, depth + 1) for v in value.values())
    if isinstance(value, (list, tuple, set, frozenset)):
        return any(_holds_object_ref(v, ref_type, depth + 1) for v in value)
    return False
