"""A rank's C heap set to keep the memory it frees, as glibc's own tuning would settle in a
fresh process.

A rank is forked from the warm parent (zygote.py) and inherits the parent's malloc state. Measured
(the compute-bound model of benchmarks/_scaling_train.py, 1 rank, 300 steps, 4 alternated rounds
on this 2-core machine): the forked rank faulted in the same ~960 fresh pages every step, its
large tensors' memory given back to the OS at each free and taken again at the next step, and
made 80.9 steps/s; a fresh process made 94.2; the forked rank with the two settings below made
94.4, with 508 page faults in all. So each rank, before the user's code runs, raises glibc's
trim threshold (freed memory at the heap's top stays the process's) and fixes its mmap threshold
at glibc's own dynamic maximum (tensors up to 32 MB come from the heap, not from a fresh mapping
each time). A rank is the process of one run: what it keeps is returned when the run ends.

Left alone when the user chose their own malloc settings (any MALLOC_*_ variable), and where the
C library has no mallopt (not glibc)."""
from __future__ import annotations

import ctypes
import os

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
TRIM_THRESHOLD_BYTES = 256 << 20
MMAP_THRESHOLD_BYTES = 32 << 20  # DEFAULT_MMAP_THRESHOLD_MAX on 64-bit: the most glibc's own tuning reaches
USER_SETTINGS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")


def keep_freed_memory(environ=os.environ) -> bool:
    """Apply the settings above to this process; whether they were applied."""
    if any(name in environ for name in USER_SETTINGS):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's own C library
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)) and bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
