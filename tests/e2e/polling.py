"""Waiting for a mesh to reach a state (metrics refresh every half second, heartbeats likewise)."""

from __future__ import annotations

import time
from collections.abc import Callable


def eventually(predicate: Callable[[], object], timeout_s: float = 10.0) -> bool:
    """True as soon as `predicate()` is truthy; False after `timeout_s` (polled every 0.1 s)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False
