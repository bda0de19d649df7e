"""BlockStore: the tiered KV block store core (pure, synchronous; the clock is injected).

- Keys are (spec namespace, chained block hash); a block remembers its parent's hash.
- Tiers: memory (byte budget) then, optionally, disk (byte budget, one file per block).
  LRU within a tier; a memory victim is demoted to disk (re-encoded as `disk_encoding`), a disk
  victim is dropped. Victims are leaves first - a suffix block goes before the prefix it extends -
  then any unpinned block. A demoted block enters the disk tier as its most recently used entry.
  A lookup, a read or a put uses a chain (a put: with the held ancestors of its parent) deepest
  first, so a parent is always more recently used than its children (`index.py` says why).
- Idle cap: a block untouched for `idle_cap_s` is dropped, whatever its tier.
- Lookup pins the prefix it found under a lease that expires by itself; pinned blocks are never
  dropped for space or idleness (they may still be demoted, and stay readable).
- Put is two-phase (`puts.py`): staged blocks become visible only on commit; duplicates are ignored.
  A put is one chain or several (each with its own parent); each block's parent is the block
  before it in its chain.
- Every change a subscriber must know is appended to `events` (drained by the shell).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from kvmesh.runtime.errors import InvalidArgument, NotFound, ResourceExhausted

from .blocks import HASH_BYTES, Block, Encoding, ModelSpec, blocks_of_run, check_spec
from .disk import DiskDir
from .events import Cleared, StoreEvent, Stored
from .index import Entry, Tier
from .leases import LeaseTable
from .results import Counters, LookupResult, PutResult, TierStats
from .puts import PutSessions
from .tiers import StoreConfig, Tiers

__all__ = ["MAX_LOOKUP_HASHES", "BlockStore", "StoreConfig"]

MAX_LOOKUP_HASHES = 65_536  # hashes in one LookupChains call (2 MiB of them)


class BlockStore:
    """The store core. `disk` is required when `config.disk_bytes > 0`; the index is rebuilt from it."""

    def __init__(self, config: StoreConfig, clock: Callable[[], float], disk: DiskDir | None = None) -> None:
        if config.disk_bytes > 0 and disk is None:
            raise ValueError("a disk tier needs a directory")
        self.config = config
        self.clock = clock
        self.disk = disk if config.disk_bytes > 0 else None
        self.counters = Counters()
        self.events: list[StoreEvent] = [Cleared()]
        self.tiers = Tiers(config, self.disk, self.counters, self.events)
        self.index = self.tiers.index
        self._leases = LeaseTable()
        self._puts = PutSessions(config.put_timeout_s, config.max_blocks_per_put)
        if self.disk is not None:
            self.tiers.rebuild(clock())

    # -- queries -------------------------------------------------------------------------

    def lookup(self, spec: ModelSpec, hashes: Iterable[bytes], lease_s: float = 0.0) -> LookupResult:
        """Longest contiguous prefix of `hashes` held; pins it under a lease (0 = the default length,
        < 0 = no lease: the prefix is only counted and touched); at most MAX_LOOKUP_HASHES hashes,
        each HASH_BYTES long."""
        check_spec(spec)
        hashes = list(hashes)
        _check_hashes("Lookup", [hashes])
        self.counters.lookup_calls += 1
        return self._lookup(spec, hashes, lease_s, self._expire(self.clock()))

    def lookup_chains(self, spec: ModelSpec, chains: list[list[bytes]], lease_s: float = 0.0) -> list[LookupResult]:
        """`lookup` of each chain, in order (one lease per chain that found blocks, none when
        `lease_s` < 0); at most MAX_LOOKUP_HASHES hashes in all, each HASH_BYTES long."""
        check_spec(spec)
        _check_hashes("LookupChains", chains)
        self.counters.lookup_calls += 1
        now = self._expire(self.clock())
        return [self._lookup(spec, chain, lease_s, now) for chain in chains]

    def _lookup(self, spec: ModelSpec, hashes: list[bytes], lease_s: float, now: float) -> LookupResult:
        found: list[Entry] = []
        for block_hash in hashes:
            entry = self.tiers.live((spec.namespace, block_hash), now)
            if entry is None:
                break
            found.append(entry)
        self.counters.lookups += 1
        self.counters.lookup_query_blocks += len(hashes)
        self.counters.lookup_hit_blocks += len(found)
        self.tiers.flush_removed()
        if not found:
            return LookupResult(0)
        if lease_s < 0:
            self.index.touch_chain(found, now)
            return LookupResult(len(found))
        duration = min(lease_s if lease_s > 0 else self.config.lease_s, self.config.max_lease_s)
        lease_id = self._leases.grant([e.key for e in found], now + duration)
        for entry in found:
            self.index.pin(entry)
        self.index.touch_chain(found, now)
        return LookupResult(len(found), lease_id, duration)

    def require(self, spec: ModelSpec, hashes: Iterable[bytes]) -> None:
        """Counts one Get; raises NotFound naming the first block of `hashes` not held."""
        self.counters.gets += 1
        self._entries(spec, hashes)

    def read(self, spec: ModelSpec, hashes: Iterable[bytes]) -> list[Block]:
        """The named blocks as stored (memory or disk); NotFound names the first one missing."""
        entries = self._entries(spec, hashes)
        now = self.clock()
        blocks = [self.tiers.payload(entry) for entry in entries]
        self.index.touch_chain(entries, now)
        self.counters.get_bytes += sum(b.nbytes for b in blocks)
        return blocks

    def tier_of(self, spec: ModelSpec, block_hash: bytes) -> Tier | None:
        entry = self.index.get((spec.namespace, block_hash))
        return entry.tier if entry else None

    def tier_hashes(self, tier: Tier) -> list[bytes]:
        """Block hashes of a tier, least recently used first."""
        return [key[1] for key in self.index.tiers[tier]]

    def held_hashes(self) -> list[bytes]:
        return [key[1] for key in self.index.entries]

    def stats(self) -> list[TierStats]:
        out = []
        for tier, capacity in ((Tier.MEMORY, self.config.memory_bytes), (Tier.DISK, self.config.disk_bytes)):
            evictions = {r: n for (t, r), n in self.counters.evictions.items() if t == tier.value}
            out.append(TierStats(tier.value, len(self.index.tiers[tier]), self.index.bytes[tier], capacity, evictions))
        return out

    @property
    def open_puts(self) -> int:
        return len(self._puts)

    @property
    def abandoned_puts(self) -> int:
        return self._puts.abandoned

    @property
    def active_leases(self) -> int:
        return len(self._leases)

    # -- two-phase put -------------------------------------------------------------------

    def open_put(self, spec: ModelSpec, producer_id: str = "", parent: bytes | None = None) -> str:
        """Opens a put session for blocks of `spec`; `parent` is the block before the first one."""
        limit = min(self.config.max_block_bytes or self.config.memory_bytes, self.config.memory_bytes)
        check_spec(spec, self.config.block_size, limit)
        if parent is not None and len(parent) not in (0, HASH_BYTES):
            raise InvalidArgument(f"parent_hash must be {HASH_BYTES} bytes, got {len(parent)}")
        return self._puts.open(spec, producer_id, parent or None, self._expire(self.clock())).put_id

    def stage(self, put_id: str, block: Block) -> None:
        """Stages one block (invisible until commit); a bad block aborts the whole put."""
        try:
            self._puts.stage(put_id, block, self.clock())
        except Exception:
            self._puts.close(put_id)
            raise

    def stage_run(self, put_id: str, encoding: Encoding, block_hashes: Sequence[bytes], checksums: Sequence[int],
                  first_index: int, data: bytes, scales: bytes) -> None:
        """Stages a run's blocks (`blocks_of_run` under the put's spec), checked as `stage` checks a
        block; a bad run aborts the whole put."""
        try:
            now = self.clock()
            spec = self._puts.get(put_id, now).spec
            self._puts.stage_run(put_id, blocks_of_run(spec, encoding, block_hashes, checksums, first_index, data, scales), now)
        except Exception:
            self._puts.close(put_id)
            raise

    def start_chain(self, put_id: str, parent: bytes | None) -> None:
        """The put's next block starts another chain after `parent`; a bad parent aborts the put."""
        try:
            if parent is not None and len(parent) not in (0, HASH_BYTES):
                raise InvalidArgument(f"parent_hash must be {HASH_BYTES} bytes, got {len(parent)}")
            self._puts.start_chain(put_id, parent or None, self.clock())
        except Exception:
            self._puts.close(put_id)
            raise

    def abort(self, put_id: str) -> None:
        self._puts.close(put_id)

    def commit(self, put_id: str, num_blocks: int) -> PutResult:
        """Makes the staged blocks visible; blocks already held are touched and counted as duplicates."""
        now = self._expire(self.clock())
        session = self._puts.get(put_id, now)
        self._puts.close(put_id)
        if num_blocks != len(session.blocks):
            raise InvalidArgument(f"put {put_id}: commit says {num_blocks} blocks but {len(session.blocks)} were sent")
        namespace = session.spec.namespace
        fresh_bytes = sum(b.nbytes for b in session.blocks if (namespace, b.header.block_hash) not in self.index)
        capacity = self.tiers.capacity
        if fresh_bytes > capacity - sum(self.index.bytes.values()):  # something must go: can it?
            if fresh_bytes > capacity - self.index.pinned_bytes:
                raise ResourceExhausted(f"put {put_id}: no room while leased blocks are pinned", self.config.lease_s)
        parent, run_parent, run = session.parent, session.parent, []
        used = self.index.lineage(namespace, parent)  # each chain's held ancestors, then its blocks (touch_chain)
        stored = duplicates = 0
        for position, block in enumerate(session.blocks):
            if position in session.chains:  # another chain starts here
                self._emit_stored(run, run_parent)
                parent, run = session.chains[position], []
                self.index.touch_chain(used, now)
                used = self.index.lineage(namespace, parent)
            key = (namespace, block.header.block_hash)
            held = self.index.get(key)
            if held is not None:
                duplicates += 1
                used.append(held)
                self._emit_stored(run, run_parent)
                run = []
            else:
                if not run:
                    run_parent = parent
                entry = Entry(key, parent, block.header, block.nbytes, Tier.MEMORY, now, block=block)
                self.index.insert(entry)
                used.append(entry)
                run.append(block.header.block_hash)
                stored += 1
            parent = block.header.block_hash
        self.index.touch_chain(used, now)
        self._emit_stored(run, run_parent)
        self.counters.puts += 1
        self.counters.put_bytes += fresh_bytes
        self.tiers.make_room()
        self.tiers.flush_removed()
        return PutResult(stored, duplicates)

    def persist(self) -> None:
        """Moves every memory block to disk (graceful shutdown), so a restart finds them there."""
        self.tiers.persist()

    # -- time ----------------------------------------------------------------------------

    def tick(self) -> None:
        """Expires leases, abandoned puts and idle blocks (the shell calls this periodically)."""
        self.tiers.drop_idle(self._expire(self.clock()))
        self.tiers.flush_removed()

    def _expire(self, now: float) -> float:
        for key in self._leases.expire(now):
            entry = self.index.get(key)
            if entry is not None:
                self.index.unpin(entry)
        self._puts.expire(now)
        return now

    # -- internals -----------------------------------------------------------------------

    def _entries(self, spec: ModelSpec, hashes: Iterable[bytes]) -> list[Entry]:
        check_spec(spec)
        now = self._expire(self.clock())
        entries = []
        for block_hash in hashes:
            entry = self.tiers.live((spec.namespace, block_hash), now)
            if entry is None:
                self.tiers.flush_removed()
                raise NotFound(f"block {block_hash.hex()[:16]} is not held (never stored, evicted or expired)")
            entries.append(entry)
        return entries

    def _emit_stored(self, hashes: list[bytes], parent: bytes | None) -> None:
        if hashes:
            self.events.append(Stored(list(hashes), parent))

    def drain_events(self) -> list[StoreEvent]:
        events = self.events[:]
        self.events.clear()  # NOTE: in place: Tiers appends to this same list
        return events


def _check_hashes(call: str, chains: list[list[bytes]]) -> None:
    total = sum(len(chain) for chain in chains)
    if total > MAX_LOOKUP_HASHES:
        raise InvalidArgument(f"{call} of {total} hashes: at most {MAX_LOOKUP_HASHES} per call")
    for n, chain in enumerate(chains):
        for i, block_hash in enumerate(chain):
            if len(block_hash) != HASH_BYTES:
                where = f"hash {i}" if call == "Lookup" else f"chain {n} hash {i}"
                raise InvalidArgument(f"{where}: must be {HASH_BYTES} bytes, got {len(block_hash)}")
