"""Keep Ctrl-C (the notebook's stop button) from cutting a release in half."""
from __future__ import annotations

import signal
import threading
from contextlib import contextmanager


@contextmanager
def deferred_interrupts():
    """Hold SIGINT while the block runs and raise KeyboardInterrupt after it, if one came.

    Only in the main thread with Python's default handler installed (as in a script or an
    IPython kernel); elsewhere the block runs unchanged."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield
        return
    received = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if received:
        raise KeyboardInterrupt
