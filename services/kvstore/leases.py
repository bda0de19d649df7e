"""Leases: Lookup pins the blocks it found until the lease expires by itself."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from .blocks import BlockKey


@dataclass(slots=True)
class Lease:
    keys: list[BlockKey]
    expires_at: float


class LeaseTable:
    def __init__(self) -> None:
        self._leases: dict[str, Lease] = {}

    def __len__(self) -> int:
        return len(self._leases)

    def grant(self, keys: list[BlockKey], expires_at: float) -> str:
        lease_id = uuid.uuid4().hex[:16]
        self._leases[lease_id] = Lease(keys, expires_at)
        return lease_id

    def expire(self, now: float) -> list[BlockKey]:
        """Ends every lease due by `now`; returns the keys they pinned (once per lease)."""
        due = [lease_id for lease_id, lease in self._leases.items() if lease.expires_at <= now]
        return [key for lease_id in due for key in self._leases.pop(lease_id).keys]
