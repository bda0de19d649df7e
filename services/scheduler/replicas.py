"""Active-active scheduler replicas: who the peers are, and each replica's admission share.

Every replica builds its own global block index from the same KV event stream and heartbeats
(nothing to agree on); what they share is small and soft: a heartbeat per replica (so each knows
how many are alive) and the blocks each routing decision predicts (`peers.py`).

Admission is a per-replica share of the mesh-wide limit, not a shared counter: with `n` live
replicas ranked by id, replica `r` admits `total // n` (+1 for the first `total % n`), so the
shares sum to exactly the limit. Pure and synchronous.

NOTE: why shares and not shared counters: a shared counter puts a NATS round-trip (or a store)
on every Route and Complete, and a replica killed with slots taken leaves them held until some
lease expires; a share needs nothing on the request path, and a dead replica's share returns to
its peers as soon as its heartbeats stop. The price is that one replica may queue while a peer
has free slots; the gateway evens that out by spreading Route calls over replicas and trying
the next replica when one answers RESOURCE_EXHAUSTED.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(slots=True)
class Peer:
    replica_id: str
    endpoint: str
    started_at: float
    last_seen: float


class ReplicaSet:
    """The live scheduler replicas as seen by `self_id` (which always counts as live)."""

    def __init__(self, self_id: str, timeout_s: float, clock: Callable[[], float]) -> None:
        self.self_id = self_id
        self.timeout_s = timeout_s
        self.clock = clock
        self._peers: dict[str, Peer] = {}

    def observe(self, replica_id: str, endpoint: str, started_at: float) -> bool:
        """Records a peer's heartbeat; True when it is new (or restarted)."""
        if replica_id == self.self_id:
            return False
        known = self._peers.get(replica_id)
        self._peers[replica_id] = Peer(replica_id, endpoint, started_at, self.clock())
        return known is None or known.started_at != started_at

    def expire(self) -> list[str]:
        """Forgets peers silent for `timeout_s`; returns their ids."""
        cutoff = self.clock() - self.timeout_s
        gone = [p.replica_id for p in self._peers.values() if p.last_seen < cutoff]
        for replica_id in gone:
            del self._peers[replica_id]
        return gone

    @property
    def live_ids(self) -> list[str]:
        return sorted({self.self_id, *self._peers})

    @property
    def count(self) -> int:
        return len(self.live_ids)

    def share(self, total: int) -> int:
        """This replica's part of a mesh-wide limit `total` (the parts sum to `total`)."""
        ids = self.live_ids
        base, extra = divmod(max(0, total), len(ids))
        return base + (1 if ids.index(self.self_id) < extra else 0)
