"""Which pool serves a production request while a canary takes a share of the traffic
(a stepwise promote): a stable draw per session (or request), so one conversation, and one
request's retries, stay on one pool."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


def draw(key: str) -> float:
    """A uniform number in [0, 1) fixed by `key`."""
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


@dataclass(frozen=True, slots=True)
class PoolSplit:
    production: str = "production"
    canary: str = ""
    canary_weight: float = 0.0

    def __post_init__(self) -> None:
        if not self.production:
            raise ValueError("the production pool is required")
        if not 0.0 <= self.canary_weight <= 1.0:
            raise ValueError(f"canary_weight must be in [0, 1], got {self.canary_weight}")
        if self.canary_weight > 0.0 and not self.canary:
            raise ValueError("a canary_weight above 0 needs a canary pool")
        if self.canary and self.canary == self.production:
            raise ValueError(f"the canary pool must differ from the production pool ({self.production!r})")

    def pool_for(self, key: str) -> str:
        """The pool whose share `key` falls in."""
        if self.canary_weight > 0.0 and draw(key) < self.canary_weight:
            return self.canary
        return self.production
