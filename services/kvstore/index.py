"""The store's index: which tier holds each block, LRU order per tier, parent → children links."""

from __future__ import annotations

import enum
from collections import OrderedDict, defaultdict
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
        entry.tier, entry.nbytes = tier, nbytes
        self.tiers[tier][entry.key] = entry
        self.bytes[tier] += nbytes

    def touch(self, entry: Entry, now: float) -> None:
        entry.last_access = now
        self.tiers[entry.tier].move_to_end(entry.key)

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
