"""The store's index: which tier holds each block, LRU order per tier, parent → children links.

A chain is used root first (a lookup, a read, a put), and every use of a block is a use of its
ancestors, so the index keeps each parent more recently used than its children (`touch_chain`):
then the least recently used end of a tier holds leaves, and `victim` finds one at once. Touched in
chain order, a chain's root was its oldest block, and evicting the chain (leaves first) walked past
all its ancestors for every block. That, and summing the pinned bytes over every entry on each put,
made a full store's put 4-6x the CPU it takes now (`bench/kvstore_evict.py`: 2.5 → 0.59 ms at 20,000
blocks, 5.6 → 0.89 ms at 70,000, a 1 GiB memory tier of the tiny model's blocks); under the fidelity
trace the store's CPU a request went from ~2.7 ms to ~4.5 ms once it was full and evicting.
"""

from __future__ import annotations

import enum
from collections import OrderedDict, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from .blocks import Block, BlockHeader, BlockKey


class Tier(enum.Enum):
    MEMORY = "memory"
    DISK = "disk"


@dataclass(slots=True)
class Entry:
    key: BlockKey
    parent: bytes | None
    header: BlockHeader
    nbytes: int  # counted against its tier
    tier: Tier
    last_access: float
    pins: int = 0
    block: Block | None = None  # the payload while in memory


class TierIndex:
    """Entries by key, each tier an LRU (least recently used first), and children of each parent."""

    def __init__(self) -> None:
        self.entries: dict[BlockKey, Entry] = {}
        self.tiers: dict[Tier, OrderedDict[BlockKey, Entry]] = {t: OrderedDict() for t in Tier}
        self.bytes: dict[Tier, int] = {t: 0 for t in Tier}
        # the bytes of the pinned entries, every tier: a full store's every put asks, and summing
        # them over every entry took ~2 ms a put at 70,000 blocks
        self.pinned_bytes = 0
        self._children: dict[BlockKey, set[BlockKey]] = defaultdict(set)

    def __contains__(self, key: BlockKey) -> bool:
        return key in self.entries

    def get(self, key: BlockKey) -> Entry | None:
        return self.entries.get(key)

    def insert(self, entry: Entry) -> None:
        """Adds `entry` as the most recently used of its tier."""
        self.entries[entry.key] = entry
        self.tiers[entry.tier][entry.key] = entry
        self.bytes[entry.tier] += entry.nbytes
        if entry.parent is not None:
            self._children[(entry.key[0], entry.parent)].add(entry.key)

    def remove(self, entry: Entry) -> None:
        if entry.pins > 0:
            self.pinned_bytes -= entry.nbytes
        del self.entries[entry.key]
        del self.tiers[entry.tier][entry.key]
        self.bytes[entry.tier] -= entry.nbytes
        if entry.parent is not None:
            parent_key = (entry.key[0], entry.parent)
            siblings = self._children.get(parent_key)
            if siblings is not None:
                siblings.discard(entry.key)
                if not siblings:
                    del self._children[parent_key]

    def move(self, entry: Entry, tier: Tier, nbytes: int) -> None:
        """Moves `entry` to `tier` (as its most recently used) now counting `nbytes`."""
        del self.tiers[entry.tier][entry.key]
        self.bytes[entry.tier] -= entry.nbytes
        if entry.pins > 0:
            self.pinned_bytes += nbytes - entry.nbytes
        entry.tier, entry.nbytes = tier, nbytes
        self.tiers[tier][entry.key] = entry
        self.bytes[tier] += nbytes

    def pin(self, entry: Entry) -> None:
        """Adds one pin (pins change only here and in `unpin`, so they never go below 0)."""
        if entry.pins == 0:
            self.pinned_bytes += entry.nbytes
        entry.pins += 1

    def unpin(self, entry: Entry) -> None:
        """Drops one pin, if it has any (a lease can outlive its entry's replacement by a new put)."""
        if entry.pins == 0:
            return
        entry.pins -= 1
        if entry.pins == 0:
            self.pinned_bytes -= entry.nbytes

    def touch(self, entry: Entry, now: float) -> None:
        entry.last_access = now
        self.tiers[entry.tier].move_to_end(entry.key)

    def touch_chain(self, chain: Sequence[Entry], now: float) -> None:
        """Marks `chain` (root first) used now, deepest first: each parent ends up more recently used
        than its children (the module docstring says why)."""
        for entry in reversed(chain):
            self.touch(entry, now)

    def lineage(self, namespace: str, block_hash: bytes | None) -> list[Entry]:
        """The held chain ending at `block_hash`, root first: its entry and its held ancestors (up to
        the first that is not held). Bounded by the index's size, so a cycle of parents (hashes a
        client made up) ends too."""
        out: list[Entry] = []
        for _ in range(len(self.entries)):
            entry = None if block_hash is None else self.entries.get((namespace, block_hash))
            if entry is None:
                break
            out.append(entry)
            block_hash = entry.parent
        out.reverse()
        return out

    def is_leaf(self, entry: Entry) -> bool:
        """No child in this tier or a hotter one: in memory, no child in memory; on disk, no child held."""
        children = self._children.get(entry.key, ())
        if entry.tier is Tier.MEMORY:
            return not any(self.entries[c].tier is Tier.MEMORY for c in children)
        return not children

    def victim(self, tier: Tier, allow_pinned: bool) -> Entry | None:
        """Least recently used unpinned leaf, else unpinned block, else (if allowed) any block."""
        entries = self.tiers[tier].values()
        for entry in entries:
            if not entry.pins and self.is_leaf(entry):
                return entry
        for entry in entries:
            if not entry.pins:
                return entry
        return next(iter(entries), None) if allow_pinned else None
