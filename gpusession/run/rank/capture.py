"""Capture a worker's stdout and stderr at the file-descriptor level while a run lasts.

Redirecting fds 1 and 2 (not just sys.stdout) catches C-level output too (printf, NCCL, CUDA),
and keeps it out of Ray's per-worker log files, so Ray's log forwarding never duplicates it.
"""
from __future__ import annotations

import codecs
import ctypes
import os
import sys
import threading
from typing import Callable

Sink = Callable[[str, str], None]  # (stream name, text)
_JOIN_TIMEOUT_S = 1.0  # a forked child may still hold the pipe; don't wait for it forever

try:
    _libc = ctypes.CDLL(None)
except OSError:  # pragma: no cover - every Linux has a libc
    _libc = None


def flush_all() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    if _libc is not None:
        _libc.fflush(None)  # C stdio buffers: printf output would otherwise appear after the run


class FdCapture:
    def __init__(self, sink: Sink) -> None:
        self._sink = sink
        self._saved: dict[int, int] = {}
        self._readers: list[threading.Thread] = []
        self._line_buffering: dict[str, bool] = {}

    def __enter__(self) -> "FdCapture":
        flush_all()
        for fd, name in ((1, "stdout"), (2, "stderr")):
            read_end, write_end = os.pipe()
            self._saved[fd] = os.dup(fd)
            os.dup2(write_end, fd)
            os.close(write_end)
            reader = threading.Thread(target=self._pump, args=(read_end, name), daemon=True,
                                      name=f"gpusession-capture-{name}")
            reader.start()
            self._readers.append(reader)
        self._set_line_buffering(True)
        return self

    def __exit__(self, *exc) -> None:
        flush_all()
        self._set_line_buffering(False)
        for fd, saved in self._saved.items():
            os.dup2(saved, fd)  # drops the last write end of the pipe: the reader sees EOF
            os.close(saved)
        for reader in self._readers:
            reader.join(_JOIN_TIMEOUT_S)

    def _pump(self, read_end: int, name: str) -> None:
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        try:
            while chunk := os.read(read_end, 65536):
                text = decoder.decode(chunk)
                if text:
                    self._sink(name, text)
            tail = decoder.decode(b"", final=True)
            if tail:
                self._sink(name, tail)
        finally:
            os.close(read_end)

    def _set_line_buffering(self, on: bool) -> None:
        """Python buffers a non-tty stdout by blocks; lines must leave as they are printed."""
        for name in ("stdout", "stderr"):
            stream = getattr(sys, name)
            reconfigure = getattr(stream, "reconfigure", None)
            if reconfigure is None:
                continue
            if on:
                self._line_buffering[name] = stream.line_buffering
                reconfigure(line_buffering=True)
            elif name in self._line_buffering:
                reconfigure(line_buffering=self._line_buffering[name])
