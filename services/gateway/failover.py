"""Which scheduler replica to ask next: a round-robin ring that tries the others when one fails.

Pure. Every request starts at the next replica in turn (so Route calls, and with them each
replica's admission share, spread evenly); a replica that just failed is tried last for
`down_s`, so a dead one costs at most one failed attempt per `down_s`, not one per request.
"""

from __future__ import annotations

import time
from collections.abc import Callable


def parse_endpoints(value: str) -> list[str]:
    """"a:1, b:2" → ["a:1", "b:2"]; ValueError for an empty list."""
    endpoints = [e.strip() for e in value.split(",") if e.strip()]
    if not endpoints:
        raise ValueError("at least one scheduler endpoint is required")
    return endpoints


class EndpointRing:
    def __init__(self, endpoints: list[str], down_s: float = 2.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.endpoints = list(endpoints)
        self.down_s = down_s
        self.clock = clock
        self._next = 0
        self._down_until: dict[str, float] = {}

    def order(self) -> list[str]:
        """Every endpoint once: starting at the next in turn, the ones marked down last."""
        n = len(self.endpoints)
        start, self._next = self._next, (self._next + 1) % n
        ring = [self.endpoints[(start + i) % n] for i in range(n)]
        now = self.clock()
        return sorted(ring, key=lambda e: self._down_until.get(e, 0.0) > now)

    def failed(self, endpoint: str) -> None:
        self._down_until[endpoint] = self.clock() + self.down_s

    def succeeded(self, endpoint: str) -> None:
        self._down_until.pop(endpoint, None)
