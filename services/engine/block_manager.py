"""Paged KV block allocation with ref counts and prefix caching (pure Python, torch-free).

A block is free when its ref count is 0. Free blocks sit in one queue: blocks that hold no
cached content are reused first (front), cached ones are kept in LRU order (back) and evicted
from the front of that LRU run only when nothing else is free. A cached block is found by its
chained block hash and a hit is confirmed by comparing token ids. A block imported by hash alone
(pre-warmed from the KV store, whose blocks carry no token ids) is confirmed by its chained hash on
its first hit and takes that request's token ids.

Every block that enters or leaves the cache is recorded as a KV event
(`("stored", [hash], parent_hash)`, `("removed", [hash], None)`) for workers to publish.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass


MAX_PENDING_EVENTS = 65536
KvEvent = tuple[str, list[bytes], bytes | None]  # (kind, block hashes in chain order, parent hash)


class NoFreeBlocksError(RuntimeError):
    """Raised when more blocks are requested than are free (callers check `num_free_blocks` first)."""


@dataclass(slots=True)
class Block:
    block_id: int
    ref_count: int = 0
    block_hash: bytes | None = None
    token_ids: tuple[int, ...] | None = None
    parent_hash: bytes | None = None


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be >= 1, got {num_blocks}, {block_size}")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._cached: dict[bytes, int] = {}
        self._events: list[KvEvent] = []
        self._events_overflowed = False

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def free_block_ids(self) -> list[int]:
        """Free blocks in reuse order (next to be handed out first)."""
        return list(self._free)

    def lookup(self, block_hash: bytes, token_ids: Sequence[int]) -> int | None:
        """The cached block holding exactly `token_ids` under `block_hash`, if any."""
        block_id = self._cached.get(block_hash)
        if block_id is None:
            return None
        block = self.blocks[block_id]
        if block.token_ids is None:  # imported by hash alone: the chained hash confirms it
            block.token_ids = tuple(token_ids)
        elif block.token_ids != tuple(token_ids):
            return None
        return block_id

    def is_cached(self, block_hash: bytes) -> bool:
        return block_hash in self._cached

    def match_prefix(self, block_hashes: Sequence[bytes], token_ids: Sequence[int]) -> list[int]:
        """Block ids of the leading cached blocks of `token_ids` (does not take references)."""
        if not self.enable_prefix_caching:
            return []
        hits: list[int] = []
        bs = self.block_size
        for i, block_hash in enumerate(block_hashes):
            block_id = self.lookup(block_hash, token_ids[i * bs : (i + 1) * bs])
            if block_id is None:
                break
            hits.append(block_id)
        return hits

    def num_free_among(self, block_ids: Sequence[int]) -> int:
        return sum(1 for b in block_ids if self.blocks[b].ref_count == 0)

    def take(self, block_ids: Sequence[int]) -> None:
        """Add a reference to each (cached) block, pulling free ones out of the free queue."""
        for block_id in block_ids:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self._free[block_id]
            block.ref_count += 1

    def allocate(self, n: int) -> list[int]:
        """Hand out `n` blocks with ref count 1, evicting least recently used cached blocks."""
        if n > len(self._free):
            raise NoFreeBlocksError(f"asked for {n} blocks, {len(self._free)} free")
        out: list[int] = []
        for _ in range(n):
            block_id, _ = self._free.popitem(last=False)
            self._evict(block_id)
            self.blocks[block_id].ref_count = 1
            out.append(block_id)
        return out

    def free(self, block_ids: Sequence[int]) -> None:
        """Drop one reference from each block; the tail of a sequence becomes evictable first."""
        for block_id in reversed(block_ids):
            block = self.blocks[block_id]
            if block.ref_count <= 0:
                raise RuntimeError(f"block {block_id} freed with ref_count {block.ref_count}")
            block.ref_count -= 1
            if block.ref_count == 0:
                self._free[block_id] = None
                if block.block_hash is None:
                    self._free.move_to_end(block_id, last=False)

    def cache_block(
        self, block_id: int, block_hash: bytes, token_ids: Sequence[int] | None, parent_hash: bytes | None = None
    ) -> bool:
        """Register a full, computed block under its hash. False if that content is already cached."""
        if not self.enable_prefix_caching:
            return False
        block = self.blocks[block_id]
        if block.block_hash is not None or block_hash in self._cached:
            return False
        block.block_hash = block_hash
        block.token_ids = None if token_ids is None else tuple(token_ids)
        block.parent_hash = parent_hash
        self._cached[block_hash] = block_id
        self._record(("stored", [block_hash], parent_hash))
        return True

    def import_block(
        self, block_hash: bytes, token_ids: Sequence[int] | None, parent_hash: bytes | None = None
    ) -> int | None:
        """Reserve a block for content computed elsewhere; it ends up cached and free (LRU tail).
        `token_ids` None: not at hand (a pre-warmed block); the first hit supplies them.

        Returns the block id to write the KV into, or None when the content is already cached
        or nothing can be evicted. The caller writes the KV right away (before any allocation).
        """
        if not self.enable_prefix_caching or block_hash in self._cached or not self._free:
            return None
        (block_id,) = self.allocate(1)
        self.cache_block(block_id, block_hash, token_ids, parent_hash)
        self.free([block_id])
        return block_id

    def take_events(self) -> list[KvEvent]:
        """Drain cache events since the last call, merging runs of the same kind along a chain.

        If too many piled up undrained, returns "cleared" followed by every cached block instead.
        """
        events, self._events = self._events, []
        if self._events_overflowed:
            self._events_overflowed = False
            return [("cleared", [], None)] + [
                ("stored", [b.block_hash], b.parent_hash) for b in self.blocks if b.block_hash is not None
            ]
        merged: list[KvEvent] = []
        for kind, hashes, parent in events:
            if merged and merged[-1][0] == kind and (kind == "removed" or merged[-1][1][-1] == parent):
                merged[-1][1].extend(hashes)
            else:
                merged.append((kind, list(hashes), parent))
        return merged

    def _record(self, event: KvEvent) -> None:
        if self._events_overflowed:
            return
        if len(self._events) >= MAX_PENDING_EVENTS:
            self._events_overflowed = True
            self._events = []
            return
        self._events.append(event)

    def _evict(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.block_hash is not None:
            del self._cached[block.block_hash]
            self._record(("removed", [block.block_hash], None))
            block.block_hash = None
            block.token_ids = None
            block.parent_hash = None
