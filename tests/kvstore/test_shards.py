"""A sharded KV store: rendezvous placement, per-shard lookup fan-out, a dead shard, hot-block replicas.

Real KV store servers (in-process, 127.0.0.1:0) behind the client that prefill and decode use."""

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from kvmesh.kvstore.main import start
from kvmesh.kvstore.metrics import StoreMetrics
from kvmesh.kvstore.server import block_to_pb
from kvmesh.runtime.grpcutil import ChannelPool
from kvmesh.runtime.kvshardclient import ShardedStore
from kvmesh.runtime.kvstoremsgs import Chain
from kvmesh.runtime.kvshards import Shard, ShardDirectory, contiguous_prefix, rank, split_by_owner
from kvmesh.runtime.pb import common_pb2, events_pb2

from ..fakeclock import FakeClock
from .conftest import SPEC, chain, h
from .test_server import SPEC_PB, settings

SHARDS = [Shard(f"kvstore-{i}", f"127.0.0.1:{i}") for i in range(4)]
NAMES = [f"b{i}" for i in range(24)]


def test_a_block_has_one_owner_everywhere_and_losing_a_shard_moves_only_its_blocks():
    hashes = [h(n) for n in NAMES]
    owners = {x: rank(x, SHARDS)[0] for x in hashes}
    assert owners == {x: rank(x, list(reversed(SHARDS)))[0] for x in hashes}
    assert len(set(owners.values())) == 4
    gone = SHARDS[1]
    rest = [s for s in SHARDS if s != gone]
    for x in hashes:
        new = rank(x, rest)[0]
        assert new == owners[x] if owners[x] != gone else new == rank(x, SHARDS)[1]


@pytest.mark.parametrize("count", [1, 2, 4])
def test_blocks_are_split_by_their_rendezvous_owner_in_order(count):
    hashes = [h(n) for n in NAMES]
    expected: dict[Shard, list[int]] = {}
    for i, x in enumerate(hashes):
        expected.setdefault(rank(x, SHARDS[:count])[0], []).append(i)
    assert split_by_owner(hashes, SHARDS[:count]) == expected
    assert split_by_owner([], SHARDS[:count]) == {}


def test_the_mesh_wide_prefix_ends_at_the_first_block_its_shard_lacks():
    hashes = [h(n) for n in NAMES[:8]]
    groups = split_by_owner(hashes, SHARDS[:2])
    assert sorted(i for positions in groups.values() for i in positions) == list(range(8))
    full = {s: len(p) for s, p in groups.items()}
    assert contiguous_prefix(8, groups, full) == 8
    a, b = groups
    assert contiguous_prefix(8, groups, {**full, a: 1}) == groups[a][1]
    assert contiguous_prefix(8, groups, {b: full[b]}) == groups[a][0]  # a's answer is missing


def test_shards_are_discovered_from_heartbeats_and_leave_when_silent_or_draining():
    clock = FakeClock()
    directory = ShardDirectory.from_setting("nats")
    directory.clock = clock
    beat = events_pb2.Heartbeat(worker_id="kvstore-0", role=common_pb2.WORKER_ROLE_KVSTORE, endpoint="127.0.0.1:7")
    directory.observe(beat)
    directory.observe(events_pb2.Heartbeat(worker_id="d", role=common_pb2.WORKER_ROLE_DECODE, endpoint="127.0.0.1:8"))
    directory.observe(events_pb2.Heartbeat(worker_id="kvstore-1", role=common_pb2.WORKER_ROLE_KVSTORE, endpoint="127.0.0.1:9"))
    assert [s.shard_id for s in directory.shards()] == ["kvstore-0", "kvstore-1"]
    directory.observe(events_pb2.Heartbeat(worker_id="kvstore-1", role=common_pb2.WORKER_ROLE_KVSTORE,
                                           endpoint="127.0.0.1:9", draining=True))
    assert directory.shards() == [Shard("kvstore-0", "127.0.0.1:7")]
    clock.advance(3.5)
    assert directory.shards() == []
    assert ShardDirectory.from_setting("") is None
    assert ShardDirectory.from_setting("a:1,b:2").shards() == [Shard("kvstore-0", "a:1"), Shard("kvstore-1", "b:2")]


@pytest.fixture
async def shards():
    running = [await start(settings(store_id=f"kvstore-{i}", memory_bytes=64 * 512), StoreMetrics(CollectorRegistry()))
               for i in range(3)]
    pool = ChannelPool()
    yield running, pool
    await pool.close()
    for store in running:
        if not store.draining:
            await store.stop()


def client(running, pool, **options) -> tuple[ShardedStore, ShardDirectory]:
    clock = FakeClock()
    directory = ShardDirectory(timeout_s=60.0, clock=clock)
    for store in running:
        directory.observe(events_pb2.Heartbeat(worker_id=store.store_id, role=common_pb2.WORKER_ROLE_KVSTORE,
                                               endpoint=store.endpoint))
    return ShardedStore(directory, pool, SPEC_PB, timeout_s=5.0, **options), directory


async def test_blocks_spread_over_shards_and_a_lookup_fans_out_and_gets_them_back_in_order(shards):
    running, pool = shards
    store, directory = client(running, pool)
    blocks = [block_to_pb(b) for b in chain(*NAMES)]
    assert await store.put("t", blocks) == (24, 0)
    hashes = [h(n) for n in NAMES]
    held = {s.store_id: set(s.store.held_hashes()) for s in running}
    assert sorted(len(v) for v in held.values()) != [0, 0, 24] and sum(len(v) for v in held.values()) == 24
    for x in hashes:
        assert x in held[directory.owners(x)[0].shard_id]
    found = await store.lookup(hashes)
    assert found.num_blocks == 24
    got = await store.get(hashes, 5, found, common_pb2.KV_ENCODING_RAW)
    assert [f.block() for f in got] == blocks[5:]  # bytes with the header read; the rest parsed by the caller


async def test_each_shard_gets_its_share_as_chains_linked_to_the_true_parents(shards):
    running, pool = shards
    store, directory = client(running, pool)
    turns = [Chain([block_to_pb(b) for b in chain(*NAMES[:12])], h("p")),
             Chain([block_to_pb(b) for b in chain(*NAMES[12:], start=12)], h(NAMES[11]))]
    assert await store.put_chains("t", turns) == (24, 0)
    assert sum(s.store.counters.puts for s in running) == 3  # one Put per shard for both turns
    parents = [h("p")] + [h(n) for n in NAMES[:-1]]
    for name, parent in zip(NAMES, parents):
        owner = next(s for s in running if s.store_id == directory.owners(h(name))[0].shard_id)
        assert owner.store.index.get((SPEC.namespace, h(name))).parent == parent


async def test_a_dead_shard_costs_only_its_blocks(shards):
    running, pool = shards
    store, directory = client(running, pool)
    hashes = [h(n) for n in NAMES]
    await store.put("t", [block_to_pb(b) for b in chain(*NAMES)])
    victim = running[1]
    first_lost = next(i for i, x in enumerate(hashes) if directory.owners(x)[0].shard_id == victim.store_id)
    victim.draining = True
    await victim.stop()
    found = await store.lookup(hashes)
    assert found.num_blocks == first_lost and store.failures == 1
    assert [s.shard_id for s in directory.shards()] == ["kvstore-0", "kvstore-2"]  # left out until it beats again
    found = await store.lookup(hashes)  # its blocks now map to the live shards, which miss them: recompute
    assert found.num_blocks == first_lost
    lost = sum(1 for x in hashes if rank(x, [Shard(r.store_id, r.endpoint) for r in running])[0].shard_id == victim.store_id)
    assert await store.put("t", [block_to_pb(b) for b in chain(*NAMES)]) == (lost, 24 - lost)  # recomputed ones go back
    assert (await store.lookup(hashes)).num_blocks == 24


async def test_hot_blocks_are_copied_to_the_next_shards_and_survive_their_owner(shards):
    running, pool = shards
    store, directory = client(running, pool, replicas=2, hot_hits=2)
    hashes = [h(n) for n in NAMES[:6]]
    await store.put("t", [block_to_pb(b) for b in chain(*NAMES[:6])])
    for _ in range(2):
        found = await store.lookup(hashes)
        await store.get(hashes, 0, found, common_pb2.KV_ENCODING_RAW)
    for _ in range(100):
        if store.replicated == 6:
            break
        await asyncio.sleep(0.02)
    assert store.replicated == 6
    owner = directory.owners(hashes[0])[0]
    victim = next(s for s in running if s.store_id == owner.shard_id)
    victim.draining = True
    await victim.stop()
    directory.forget(owner)
    found = await store.lookup(hashes)
    assert found.num_blocks == 6
    assert len(await store.get(hashes, 0, found, common_pb2.KV_ENCODING_RAW)) == 6
