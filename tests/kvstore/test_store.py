"""BlockStore core: exact eviction order, demotion, idle cap, leases, two-phase put, events."""

from __future__ import annotations

import dataclasses

import pytest

from kvmesh.kvstore.blocks import Encoding
from kvmesh.kvstore.events import Cleared, Removed, Stored
from kvmesh.kvstore.index import Tier
from kvmesh.kvstore.store import BlockStore, StoreConfig
from kvmesh.runtime.errors import FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted

from .conftest import BLOCK_BYTES, SPEC, block, chain, h

DISK_FILE_BYTES = 1000  # one block file (512 payload bytes + header) is a little under this


def make_store(clock, memory_blocks=4, disk_blocks=0, disk=None, **overrides) -> BlockStore:
    config = StoreConfig(memory_bytes=memory_blocks * BLOCK_BYTES, disk_bytes=disk_blocks * DISK_FILE_BYTES, **overrides)
    return BlockStore(config, clock, disk)


def put(store, blocks, parent=None):
    put_id = store.open_put(SPEC, "test", parent)
    for b in blocks:
        store.stage(put_id, b)
    return store.commit(put_id, len(blocks))


def removed(store) -> list[str]:
    """Names of the blocks removed since the last call, in order."""
    names = {h(n): n for n in "a1 a2 a3 b1 b2 c1 c2 d1 e1 x".split()}
    return [names[x] for e in store.drain_events() if isinstance(e, Removed) for x in e.hashes]


def hashes(*names):
    return [h(n) for n in names]


# -- lookup ------------------------------------------------------------------------------


def test_lookup_finds_the_longest_contiguous_prefix(clock):
    store = make_store(clock)
    put(store, chain("a1", "a2", "a3"))
    assert store.lookup(SPEC, hashes("a1", "a2", "x", "a3")).num_blocks == 2
    assert store.lookup(SPEC, hashes("x", "a1")).num_blocks == 0
    assert store.lookup(dataclasses.replace(SPEC, model_id="other"), hashes("a1")).num_blocks == 0


def test_read_returns_the_exact_bytes_put(clock):
    store = make_store(clock)
    put(store, chain("a1", "a2"))
    assert store.read(SPEC, hashes("a1", "a2")) == chain("a1", "a2")
    with pytest.raises(NotFound, match=h("x").hex()[:16]):
        store.read(SPEC, hashes("a1", "x"))


# -- eviction ----------------------------------------------------------------------------


def test_memory_only_evicts_suffixes_before_their_prefixes_then_lru(clock):
    store = make_store(clock, memory_blocks=4)
    put(store, chain("a1", "a2", "a3"))
    clock.advance(1)
    put(store, chain("b1"))
    removed(store)
    for names, parent in ((["c1"], None), (["c2"], "c1"), (["d1"], None), (["e1"], None)):
        clock.advance(1)
        put(store, chain(*names, start=1 if parent else 0), h(parent) if parent else None)
    assert removed(store) == ["a3", "a2", "a1", "b1"]
    # c2's put used its parent c1 too: a parent is kept more recently used than its children
    assert store.tier_hashes(Tier.MEMORY) == hashes("c2", "c1", "d1", "e1")
    assert store.stats()[0].evictions == {"lru": 4}


def test_a_lookup_makes_a_block_recently_used(clock):
    store = make_store(clock, memory_blocks=3)
    for name in ("a1", "b1", "c1"):
        put(store, [block(name)])
        clock.advance(1)
    store.lookup(SPEC, hashes("a1"))
    removed(store)
    put(store, [block("d1")])
    assert removed(store) == ["b1"]


def memory_order_keeps_parents_after_children(store) -> bool:
    """Every held parent comes after (more recently used than) each of its children in the memory LRU."""
    order = {key: i for i, key in enumerate(store.index.tiers[Tier.MEMORY])}
    return all(order[(k[0], e.parent)] > i for k, i in order.items()
               if (e := store.index.get(k)).parent is not None and (k[0], e.parent) in order)


def test_every_use_keeps_a_parent_more_recently_used_than_its_children(clock):
    """A lookup, a read and a put use a chain root first; the LRU end must still be a leaf, so that
    eviction (leaves first) takes it without walking past the chain's ancestors."""
    store = make_store(clock, memory_blocks=20)
    put(store, chain("a1", "a2", "a3"))
    assert memory_order_keeps_parents_after_children(store)
    clock.advance(1)
    put(store, chain("b1", "b2"))
    clock.advance(1)
    put(store, chain("c1", "c2", start=3), h("a3"))  # continues a's chain: a1-a3 are used again
    assert memory_order_keeps_parents_after_children(store)
    assert store.tier_hashes(Tier.MEMORY)[0] == h("b2")
    clock.advance(1)
    store.lookup(SPEC, hashes("b1", "b2"))
    assert memory_order_keeps_parents_after_children(store)
    assert store.tier_hashes(Tier.MEMORY)[0] == h("c2")
    clock.advance(1)
    store.read(SPEC, hashes("a1", "a2", "a3", "c1", "c2"))
    assert memory_order_keeps_parents_after_children(store)
    assert store.tier_hashes(Tier.MEMORY)[-1] == h("a1")


def test_a_cycle_of_made_up_parents_does_not_hang_a_put(clock):
    store = make_store(clock, memory_blocks=20)
    put(store, [block("a1")], h("a2"))  # a1's parent a2 is not held yet
    put(store, [block("a2", 1)], h("a1"))  # a2 after a1: the parents now form a cycle
    put(store, [block("b1", 2)], h("a2"))
    assert store.lookup(SPEC, hashes("a1")).num_blocks == 1


def test_memory_victims_are_demoted_to_disk_and_disk_victims_dropped(clock, tmp_path):
    from kvmesh.kvstore.disk import DiskDir

    store = make_store(clock, memory_blocks=2, disk_blocks=3, disk=DiskDir(tmp_path))
    put(store, chain("a1", "a2", "a3"))
    assert store.tier_hashes(Tier.MEMORY) == hashes("a2", "a1")  # a parent more recently used than its child
    assert store.tier_hashes(Tier.DISK) == hashes("a3")
    for name in ("b1", "c1", "d1"):
        clock.advance(1)
        put(store, [block(name)])
    assert store.tier_hashes(Tier.DISK) == hashes("a2", "a1", "b1")
    assert removed(store) == ["a3"]
    clock.advance(1)
    put(store, [block("e1")])
    assert removed(store) == ["a2"]
    assert store.read(SPEC, hashes("a1")) == [block("a1")]  # served from disk, byte-exact
    memory, disk = store.stats()
    assert memory.evictions == {"demote": 5} and disk.evictions == {"lru": 2}
    assert sorted(p.name[17:81] for p in tmp_path.iterdir()) == sorted(x.hex() for x in hashes("a1", "b1", "c1"))


def test_an_int8_disk_tier_stores_quantized_blocks(clock, tmp_path):
    from kvmesh.kvstore import codec
    from kvmesh.kvstore.disk import DiskDir

    store = make_store(clock, memory_blocks=1, disk_blocks=2, disk=DiskDir(tmp_path), disk_encoding=Encoding.INT8)
    put(store, chain("a1", "a2"))
    (cold,) = store.read(SPEC, hashes("a2"))
    assert cold.header.encoding is Encoding.INT8
    assert cold.nbytes == 128 + 128  # int8 values + float32 scales, against 512 raw bytes
    assert codec.convert(cold, Encoding.RAW).header.byte_length == BLOCK_BYTES


# -- idle cap ----------------------------------------------------------------------------


def test_blocks_untouched_for_the_idle_cap_are_dropped(clock):
    store = make_store(clock, idle_cap_s=60)
    put(store, [block("a1")])
    clock.advance(30)
    put(store, [block("b1")])
    clock.advance(29.9)
    store.tick()
    assert removed(store) == []
    clock.advance(0.1)
    store.tick()
    assert removed(store) == ["a1"]
    clock.advance(30)
    assert store.lookup(SPEC, hashes("b1")).num_blocks == 0  # expired even before a tick
    assert removed(store) == ["b1"]
    assert store.stats()[0].evictions == {"idle": 2}


def test_an_idle_sweep_stops_at_the_first_block_not_idle(clock):
    store = make_store(clock, memory_blocks=1000, idle_cap_s=60)
    put(store, [block("x")])
    clock.advance(30)
    put(store, chain(*(f"new{i}" for i in range(500))))
    clock.advance(30)
    looked = []
    is_idle = store.tiers.is_idle
    store.tiers.is_idle = lambda entry, now: looked.append(entry) or is_idle(entry, now)
    store.tick()
    assert removed(store) == ["x"]
    assert len(looked) == 2  # the idle block, then the first fresh one: not the other 499
    clock.advance(30)
    store.tick()
    assert sum(len(e.hashes) for e in store.drain_events() if isinstance(e, Removed)) == 500


def test_a_leased_block_outlives_the_idle_cap_until_its_lease_ends(clock):
    store = make_store(clock, idle_cap_s=60)
    put(store, [block("a1")])
    store.lookup(SPEC, hashes("a1"), lease_s=100)
    clock.advance(99)
    store.tick()
    assert removed(store) == []
    clock.advance(1)
    store.tick()
    assert removed(store) == ["a1"]


# -- leases ------------------------------------------------------------------------------


def test_a_lease_pins_blocks_against_eviction_until_it_expires(clock):
    store = make_store(clock, memory_blocks=2, lease_s=30)
    put(store, [block("a1")])
    result = store.lookup(SPEC, hashes("a1"))
    assert result.num_blocks == 1 and result.lease_id and result.expires_in_s == 30
    removed(store)
    put(store, [block("b1")])
    put(store, [block("c1")])
    assert removed(store) == ["b1"]
    clock.advance(30)
    put(store, [block("d1")])
    assert removed(store) == ["a1"]
    assert store.active_leases == 0


def test_a_put_that_cannot_fit_beside_leased_blocks_is_refused(clock):
    store = make_store(clock, memory_blocks=2)
    put(store, [block("a1")])
    put(store, [block("b1")])
    store.lookup(SPEC, hashes("a1", "b1"))
    with pytest.raises(ResourceExhausted):
        put(store, [block("c1")])
    assert store.tier_of(SPEC, h("c1")) is None


def test_the_pinned_bytes_follow_leases_through_demotion_and_expiry(clock, tmp_path):
    """The store keeps the pinned bytes as a running count (a full store asks on every put)."""
    from kvmesh.kvstore.disk import DiskDir

    store = make_store(clock, memory_blocks=2, disk_blocks=4, disk=DiskDir(tmp_path), lease_s=30)

    def scanned() -> int:
        return sum(e.nbytes for e in store.index.entries.values() if e.pins)

    put(store, chain("a1", "a2"))
    store.lookup(SPEC, hashes("a1", "a2"))
    clock.advance(10)
    store.lookup(SPEC, hashes("a1"))  # a1 pinned twice, its second lease 10 s longer
    assert store.index.pinned_bytes == scanned() == 2 * BLOCK_BYTES
    store.persist()  # the pinned blocks move to disk: their bytes are now their files'
    assert store.tier_of(SPEC, h("a1")) is Tier.DISK
    assert store.index.pinned_bytes == scanned() > 2 * BLOCK_BYTES
    clock.advance(25)  # the first lease expired, a1's second one holds
    put(store, [block("d1")])
    assert store.index.pinned_bytes == scanned() == store.index.get((SPEC.namespace, h("a1"))).nbytes
    clock.advance(10)
    put(store, [block("e1")])
    assert store.index.pinned_bytes == scanned() == 0


def test_lease_length_is_capped(clock):
    store = make_store(clock, max_lease_s=60)
    put(store, [block("a1")])
    assert store.lookup(SPEC, hashes("a1"), lease_s=1e9).expires_in_s == 60


# -- two-phase put -----------------------------------------------------------------------


def test_staged_blocks_are_invisible_until_commit(clock):
    store = make_store(clock)
    put_id = store.open_put(SPEC)
    store.stage(put_id, block("a1"))
    assert store.lookup(SPEC, hashes("a1")).num_blocks == 0
    assert store.commit(put_id, 1).stored == 1
    assert store.lookup(SPEC, hashes("a1")).num_blocks == 1


def test_an_abandoned_put_is_reclaimed_after_the_timeout(clock):
    store = make_store(clock, put_timeout_s=10)
    put_id = store.open_put(SPEC)
    store.stage(put_id, block("a1"))
    clock.advance(10.5)
    store.tick()
    assert store.open_puts == 0
    with pytest.raises(FailedPrecondition, match="expired"):
        store.commit(put_id, 1)
    assert store.tier_of(SPEC, h("a1")) is None


def test_one_bad_block_aborts_the_whole_put(clock):
    store = make_store(clock)
    put_id = store.open_put(SPEC)
    store.stage(put_id, block("a1"))
    bad = dataclasses.replace(block("a2", 1), data=bytes(BLOCK_BYTES))
    with pytest.raises(InvalidArgument, match="checksum"):
        store.stage(put_id, bad)
    with pytest.raises(FailedPrecondition):
        store.commit(put_id, 2)
    assert store.held_hashes() == []


@pytest.mark.parametrize("blocks, count, message", [
    (chain("a1", "a2"), 3, "commit says 3"),
    ([block("a1", 0), block("a2", 2)], 2, "sequence order"),
])
def test_a_malformed_put_stores_nothing(clock, blocks, count, message):
    store = make_store(clock)
    with pytest.raises(InvalidArgument, match=message):
        put_id = store.open_put(SPEC)
        for b in blocks:
            store.stage(put_id, b)
        store.commit(put_id, count)
    assert store.held_hashes() == []


def test_too_many_blocks_in_one_put_is_invalid(clock):
    store = make_store(clock, max_blocks_per_put=2)
    with pytest.raises(InvalidArgument, match="more than 2 blocks"):
        put(store, chain("a1", "a2", "a3"))


def test_a_spec_with_another_block_size_or_blocks_bigger_than_memory_is_refused(clock):
    with pytest.raises(InvalidArgument, match="block_size"):
        make_store(clock, block_size=16).open_put(SPEC)
    with pytest.raises(InvalidArgument, match="over the limit"):
        BlockStore(StoreConfig(memory_bytes=BLOCK_BYTES - 1), clock).open_put(SPEC)


def test_duplicates_are_ignored_and_events_describe_the_new_chain(clock):
    store = make_store(clock)
    assert store.drain_events() == [Cleared()]
    assert put(store, chain("a1", "a2"), parent=h("x")).stored == 2
    result = put(store, chain("a1", "a2", "a3"))
    assert (result.stored, result.duplicates) == (1, 2)
    assert store.drain_events() == [Stored(hashes("a1", "a2"), h("x")), Stored(hashes("a3"), h("a2"))]


def test_a_put_of_several_chains_links_each_to_its_own_parent(clock):
    store = make_store(clock, memory_blocks=8)
    put(store, chain("b1"))
    store.drain_events()
    put_id = store.open_put(SPEC, "test", h("x"))
    for b in chain("a1", "a2"):
        store.stage(put_id, b)
    store.start_chain(put_id, h("b1"))
    for b in chain("b1", "b2", start=4):  # another turn: block_index starts afresh, b1 is held
        store.stage(put_id, b)
    store.start_chain(put_id, None)
    store.stage(put_id, block("c1", 9))
    result = store.commit(put_id, 5)
    assert (result.stored, result.duplicates) == (4, 1)
    assert store.drain_events() == [Stored(hashes("a1", "a2"), h("x")), Stored(hashes("b2"), h("b1")), Stored(hashes("c1"), None)]
    parents = {n: store.index.get((SPEC.namespace, h(n))).parent for n in ("a1", "a2", "b2", "c1")}
    assert parents == {"a1": h("x"), "a2": h("a1"), "b2": h("b1"), "c1": None}


def test_within_a_chain_blocks_still_come_in_order_and_a_bad_parent_aborts_the_put(clock):
    store = make_store(clock)
    put_id = store.open_put(SPEC, "test")
    store.stage(put_id, block("a1", 0))
    store.start_chain(put_id, h("x"))
    store.stage(put_id, block("b1", 5))
    with pytest.raises(InvalidArgument, match="does not follow"):
        store.stage(put_id, block("b2", 7))
    put_id = store.open_put(SPEC, "test")
    store.stage(put_id, block("a1", 0))
    with pytest.raises(InvalidArgument, match="parent_hash"):
        store.start_chain(put_id, b"short")
    with pytest.raises(FailedPrecondition):
        store.commit(put_id, 1)
    assert store.lookup(SPEC, hashes("a1")).num_blocks == 0
