"""Which KV store shard holds a block: rendezvous hashing over the live shards.

A block lives on the shard with the highest `sha256(shard_id + block_hash)` among the live
shards (rendezvous / highest-random-weight hashing): every client computes the same owner from
the same shard set, with no coordination, and when a shard dies only its blocks move (to the
shard that ranked second for each). Replicas of a hot block go to the shards ranked 2..R, which
are exactly where lookups go once the owner is gone.

`ShardDirectory` knows the shards: a fixed list (`--kvstore host:port[,host:port...]`), or the
stores' own heartbeats on NATS (`--kvstore nats`: `kvmesh.workers.kvstore.<id>.heartbeat`, role
KVSTORE, endpoint, draining). `split_by_owner` and `contiguous_prefix` are the pure parts of a
prefix lookup that fans out per shard. No grpc here; `kvshardclient.py` does the calls.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .bus import Bus
from .pb import common_pb2, events_pb2

log = logging.getLogger(__name__)

DISCOVER = "nats"
KVSTORE_HEARTBEATS = "kvmesh.workers.kvstore.*.heartbeat"


@dataclass(frozen=True, slots=True)
class Shard:
    shard_id: str
    endpoint: str


def _weight(block_hash: bytes) -> Callable[[Shard], bytes]:
    return lambda shard: hashlib.sha256(shard.shard_id.encode() + b"\0" + block_hash).digest()


def rank(block_hash: bytes, shards: Sequence[Shard]) -> list[Shard]:
    """`shards` in rendezvous order for `block_hash`: the owner first."""
    return sorted(shards, key=_weight(block_hash), reverse=True)


def split_by_owner(hashes: Sequence[bytes], shards: Sequence[Shard]) -> dict[Shard, list[int]]:
    """Positions of `hashes` grouped by owner shard, each group in prompt order. NOTE: one shard
    owns everything without a hash per block (a hand-back's Put asks this for every block)."""
    if len(shards) == 1:
        return {shards[0]: list(range(len(hashes)))} if hashes else {}
    groups: dict[Shard, list[int]] = {}
    for i, block_hash in enumerate(hashes):
        groups.setdefault(max(shards, key=_weight(block_hash)), []).append(i)
    return groups


def contiguous_prefix(total: int, groups: dict[Shard, list[int]], held: dict[Shard, int]) -> int:
    """Leading blocks held mesh-wide, when shard `s` holds the first `held[s]` of its positions
    `groups[s]` (what its Lookup answered; a missing answer counts as 0)."""
    prefix = total
    for shard, positions in groups.items():
        count = held.get(shard, 0)
        if count < len(positions):
            prefix = min(prefix, positions[count])
    return prefix


class ShardDirectory:
    """The live KV store shards. Static from a list, or discovered from heartbeats (`start`)."""

    def __init__(self, static: Sequence[Shard] = (), timeout_s: float = 3.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.discover = not static
        self.timeout_s = timeout_s
        self.clock = clock
        self._static = list(static)
        self._seen: dict[str, tuple[Shard, float]] = {}

    @classmethod
    def from_setting(cls, value: str, timeout_s: float = 3.0) -> ShardDirectory | None:
        """`""` → None (no store); `"nats"` → discovered; `"a:1,b:2"` → those shards."""
        value = value.strip()
        if not value:
            return None
        if value == DISCOVER:
            return cls(timeout_s=timeout_s)
        endpoints = [e.strip() for e in value.split(",") if e.strip()]
        return cls([Shard(f"kvstore-{i}" if len(endpoints) > 1 else endpoint, endpoint) for i, endpoint in enumerate(endpoints)])

    async def start(self, bus: Bus | None) -> None:
        if self.discover:
            if bus is None:
                log.warning("KV store shards are discovered on NATS, but there is no NATS: no store")
                return
            await bus.subscribe(KVSTORE_HEARTBEATS, events_pb2.Heartbeat, self._on_heartbeat)

    def observe(self, hb: events_pb2.Heartbeat) -> None:
        """A store's heartbeat: it is live (or, draining, gone)."""
        if hb.role != common_pb2.WORKER_ROLE_KVSTORE or not hb.worker_id or not hb.endpoint:
            return
        if hb.draining:
            self._seen.pop(hb.worker_id, None)
            return
        if hb.worker_id not in self._seen:
            log.info("KV store shard %s at %s", hb.worker_id, hb.endpoint)
        self._seen[hb.worker_id] = (Shard(hb.worker_id, hb.endpoint), self.clock())

    def forget(self, shard: Shard) -> None:
        """A shard that failed a call is left out until its next heartbeat (discovery only)."""
        if self.discover:
            self._seen.pop(shard.shard_id, None)

    def shards(self) -> list[Shard]:
        if not self.discover:
            return list(self._static)
        cutoff = self.clock() - self.timeout_s
        return sorted((s for s, seen in self._seen.values() if seen >= cutoff), key=lambda s: s.shard_id)

    def owners(self, block_hash: bytes, replicas: int = 1) -> list[Shard]:
        return rank(block_hash, self.shards())[: max(1, replicas)]

    async def _on_heartbeat(self, hb: events_pb2.Heartbeat, _msg) -> None:  # noqa: ANN001
        self.observe(hb)
