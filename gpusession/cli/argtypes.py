"""argparse value types the CLI's commands share: each refuses a bad value naming what to write."""
from __future__ import annotations

import argparse
import math


def seconds(text: str) -> float:
    """A duration in seconds: a finite number above 0."""
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is None or not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected seconds, a number more than 0 such as 120; got {text!r}")
    return value
