"""BlockStore with a disk tier across restarts: the index is rebuilt, bad files never served."""

from __future__ import annotations

import pytest

from kvmesh.kvstore.disk import DiskDir
from kvmesh.kvstore.events import Cleared, Removed, Stored
from kvmesh.kvstore.index import Tier
from kvmesh.kvstore.store import BlockStore, StoreConfig
from kvmesh.runtime.errors import NotFound

from .conftest import BLOCK_BYTES, SPEC, block, chain, h

CONFIG = StoreConfig(memory_bytes=4 * BLOCK_BYTES, disk_bytes=10_000)


def started(clock, path) -> BlockStore:
    return BlockStore(CONFIG, clock, DiskDir(path))


def put(store, blocks):
    put_id = store.open_put(SPEC)
    for b in blocks:
        store.stage(put_id, b)
    return store.commit(put_id, len(blocks))


def test_a_restart_rebuilds_the_index_from_disk(clock, tmp_path):
    store = started(clock, tmp_path)
    put(store, chain("a1", "a2", "a3"))
    store.persist()
    assert store.tier_hashes(Tier.MEMORY) == []

    again = started(clock, tmp_path)

    assert again.lookup(SPEC, [h("a1"), h("a2"), h("a3")]).num_blocks == 3
    assert again.read(SPEC, [h("a1"), h("a2"), h("a3")]) == chain("a1", "a2", "a3")
    events = again.drain_events()
    assert events[0] == Cleared()
    assert sorted(events[1:], key=lambda e: e.hashes) == sorted(
        [Stored([h("a1")], None), Stored([h("a2")], h("a1")), Stored([h("a3")], h("a2"))], key=lambda e: e.hashes
    )


def test_parent_links_survive_a_restart_so_suffixes_still_go_first(clock, tmp_path):
    store = started(clock, tmp_path)
    put(store, chain("a1", "a2", "a3"))
    store.persist()
    small = BlockStore(StoreConfig(memory_bytes=4 * BLOCK_BYTES, disk_bytes=2_000), clock, DiskDir(tmp_path))
    assert sorted(small.tier_hashes(Tier.DISK)) == sorted([h("a1"), h("a2")])
    assert [e for e in small.drain_events() if isinstance(e, Removed)] == [Removed([h("a3")])]


def test_a_truncated_file_is_dropped_at_restart(clock, tmp_path):
    store = started(clock, tmp_path)
    put(store, chain("a1", "a2"))
    store.persist()
    victim = DiskDir(tmp_path).path((SPEC.namespace, h("a2")))
    victim.write_bytes(victim.read_bytes()[:-100])

    again = started(clock, tmp_path)

    assert again.lookup(SPEC, [h("a1"), h("a2")]).num_blocks == 1
    assert not victim.exists()
    assert again.stats()[1].evictions == {"corrupt": 1}


def test_a_file_corrupted_while_running_is_dropped_when_read(clock, tmp_path):
    store = started(clock, tmp_path)
    put(store, [block("a1")])
    store.persist()
    path = DiskDir(tmp_path).path((SPEC.namespace, h("a1")))
    raw = bytearray(path.read_bytes())
    raw[-200] ^= 0xFF
    path.write_bytes(bytes(raw))
    store.drain_events()

    with pytest.raises(NotFound, match="corrupt"):
        store.read(SPEC, [h("a1")])

    assert store.tier_of(SPEC, h("a1")) is None and not path.exists()
    assert store.drain_events() == [Removed([h("a1")])]


def test_without_a_disk_tier_a_restart_starts_empty(clock):
    store = BlockStore(StoreConfig(memory_bytes=4 * BLOCK_BYTES), clock)
    put(store, [block("a1")])
    store.persist()  # nothing to persist to
    assert BlockStore(StoreConfig(memory_bytes=4 * BLOCK_BYTES), clock).drain_events() == [Cleared()]
