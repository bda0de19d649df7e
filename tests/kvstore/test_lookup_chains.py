"""LookupChains: several chains looked up in one call, each answered as its own Lookup would be;
no lease when asked for none; one call per shard from the client, unary Lookups on an older store."""

from __future__ import annotations

import grpc
import pytest

from kvmesh.conform.doubles import RecordingStore, add, serve
from kvmesh.kvstore.server import block_to_pb
from kvmesh.kvstore.store import MAX_LOOKUP_HASHES
from kvmesh.runtime.errors import InvalidArgument
from kvmesh.runtime.grpcutil import ChannelPool
from kvmesh.runtime.kvshardclient import NO_LEASE, UNARY_RETRY_S, ShardedStore
from kvmesh.runtime.kvstoremsgs import lookup_chains_requests
from kvmesh.runtime.kvshards import Shard, ShardDirectory
from kvmesh.runtime.pb import common_pb2, kvstore_pb2

from ..fakeclock import FakeClock
from .conftest import SPEC, chain, h
from .test_server import SPEC_PB, TIMEOUT, put, stub  # noqa: F401 - the stub fixture
from .test_server import running_factory  # noqa: F401 - the stub fixture's own
from .test_shards import NAMES, client, shards  # noqa: F401 - the shards fixture
from .test_store import hashes, make_store
from .test_store import put as put_core

CHAINS = [("a1", "a2", "a3"), ("a1", "a2", "x", "a3"), ("x", "a1"), (), ("a1",)]


def request(chains, lease_s=0.0, spec=SPEC_PB) -> kvstore_pb2.LookupChainsRequest:
    return kvstore_pb2.LookupChainsRequest(spec=spec, lease_s=lease_s,
                                           chains=[kvstore_pb2.HashChain(block_hashes=hashes(*c)) for c in chains])


# -- the store core ----------------------------------------------------------------------


def test_each_chain_is_answered_as_its_own_lookup_with_a_lease_each(clock):
    store = make_store(clock)
    put_core(store, chain("a1", "a2", "a3"))
    results = store.lookup_chains(SPEC, [hashes(*c) for c in CHAINS])
    assert [r.num_blocks for r in results] == [store.lookup(SPEC, hashes(*c), NO_LEASE).num_blocks for c in CHAINS]
    assert [r.num_blocks for r in results] == [3, 2, 0, 0, 1]
    assert [bool(r.lease_id) for r in results] == [True, True, False, False, True]
    assert (store.counters.lookups, store.counters.lookup_calls) == (10, 6)  # 5 chains + 5 Lookups; 1 + 5 calls


def test_no_lease_is_taken_when_asked_for_none(clock):
    store = make_store(clock, memory_blocks=3)
    put_core(store, chain("a1", "a2", "a3"))
    results = store.lookup_chains(SPEC, [hashes("a1", "a2", "a3")], lease_s=NO_LEASE)
    assert (results[0].num_blocks, results[0].lease_id, results[0].expires_in_s) == (3, "", 0.0)
    assert store.active_leases == 0
    assert all(entry.pins == 0 for entry in store.index.entries.values())
    assert put_core(store, chain("b1")).stored == 1  # a full store evicts for it: nothing is pinned


def test_bad_input_is_refused_before_anything_is_counted(clock):
    store = make_store(clock)
    with pytest.raises(InvalidArgument, match="32 bytes"):
        store.lookup_chains(SPEC, [hashes("a1"), [b"short"]])
    with pytest.raises(InvalidArgument, match="at most 65536"):
        store.lookup_chains(SPEC, [[h("a1")] * MAX_LOOKUP_HASHES, [h("a1")]])
    assert (store.counters.lookups, store.counters.lookup_calls) == (0, 0)


# -- over gRPC ---------------------------------------------------------------------------


async def test_lookup_chains_over_grpc_matches_a_lookup_per_chain(stub):  # noqa: F811
    await put(stub, chain("a1", "a2", "a3"))
    reply = await stub.LookupChains(request(CHAINS), timeout=TIMEOUT)
    singles = [await stub.Lookup(kvstore_pb2.LookupRequest(spec=SPEC_PB, block_hashes=hashes(*c)), timeout=TIMEOUT)
               for c in CHAINS]
    assert [c.num_blocks for c in reply.chains] == [s.num_blocks for s in singles] == [3, 2, 0, 0, 1]
    assert all(c.lease_id and 0 < c.lease_expires_in_s <= 30 for c in reply.chains if c.num_blocks)
    unleased = await stub.LookupChains(request(CHAINS, lease_s=-1), timeout=TIMEOUT)
    assert [(c.num_blocks, c.lease_id, c.lease_expires_in_s) for c in unleased.chains] == \
        [(3, "", 0.0), (2, "", 0.0), (0, "", 0.0), (0, "", 0.0), (1, "", 0.0)]
    stats = await stub.Stats(kvstore_pb2.StatsRequest(), timeout=TIMEOUT)
    assert (stats.lookups, stats.lookup_calls) == (15, 7)


@pytest.mark.parametrize("bad", ["spec", "hash", "count"])
async def test_bad_lookup_chains_fail_invalid_argument(stub, bad):  # noqa: F811
    if bad == "spec":
        call = stub.LookupChains(request(CHAINS, spec=common_pb2.ModelSpec()), timeout=TIMEOUT)
    elif bad == "hash":
        call = stub.LookupChains(kvstore_pb2.LookupChainsRequest(
            spec=SPEC_PB, chains=[kvstore_pb2.HashChain(block_hashes=[bytes(31)])]), timeout=TIMEOUT)
    else:
        call = stub.LookupChains(kvstore_pb2.LookupChainsRequest(
            spec=SPEC_PB, chains=[kvstore_pb2.HashChain(block_hashes=[bytes(32)] * (MAX_LOOKUP_HASHES + 1))]), timeout=TIMEOUT)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


# -- the sharded client ------------------------------------------------------------------


async def test_chains_over_several_shards_take_one_call_per_shard_and_match_lookups(shards):  # noqa: F811
    running, pool = shards
    store, _ = client(running, pool)
    await store.put("t", [block_to_pb(b) for b in chain(*NAMES[:16])])
    chains = [[h(n) for n in NAMES], [h(n) for n in NAMES[:5]], [h("x"), h(NAMES[0])], [], [h(n) for n in NAMES[:16]]]
    calls_before = [s.store.counters.lookup_calls for s in running]
    found = await store.lookup_chains(chains, NO_LEASE)
    assert [s.store.counters.lookup_calls - b for s, b in zip(running, calls_before)] == [1, 1, 1]
    assert all(s.store.active_leases == 0 for s in running)
    singles = [await store.lookup(c) for c in chains]
    assert [f.num_blocks for f in found] == [s.num_blocks for s in singles] == [16, 5, 0, 0, 16]
    assert [f.owners for f in found] == [s.owners for s in singles]


def test_requests_keep_at_most_the_hash_limit_in_order():
    shares = [[h("a")] * 3, [h("b")] * 2, [h("c")] * 5, []]
    requests = lookup_chains_requests(SPEC_PB, shares, NO_LEASE, max_hashes=4)
    assert [[len(c.block_hashes) for c in r.chains] for r in requests] == [[3], [2], [4, 0]]
    assert all(r.lease_s == NO_LEASE for r in requests)


class OldStore(RecordingStore):
    """A store from before LookupChains (the double's own one is hidden)."""

    async def LookupChains(self, request, context):  # noqa: ANN001, N802
        self.lookups.append("LookupChains")
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not implemented!")


async def test_a_store_without_lookup_chains_gets_unary_lookups_and_is_asked_again_later():
    old = OldStore()
    served = await serve(0, add(old))
    pool, clock = ChannelPool(), FakeClock()
    try:
        store = ShardedStore(ShardDirectory([Shard("old", served.endpoint)]), pool, SPEC_PB, 5.0, clock=clock)
        chains = [[h("a1"), h("a2")], [h("b1")], [h("c1")]]
        assert [f.num_blocks for f in await store.lookup_chains(chains)] == [0, 0, 0]
        assert old.lookups == ["LookupChains", "Lookup", "Lookup", "Lookup"]
        await store.lookup_chains(chains[:2])
        assert old.lookups[4:] == ["Lookup", "Lookup"]  # remembered: no LookupChains tried
        clock.advance(UNARY_RETRY_S)
        await store.lookup_chains(chains[:1])
        assert old.lookups[6:] == ["LookupChains", "Lookup"] and store.failures == 0
    finally:
        await pool.close()
        await served.stop()


@pytest.mark.parametrize("bad", ["hash", "count"])
async def test_a_unary_lookup_with_a_bad_hash_or_too_many_is_invalid_argument(stub, bad):  # noqa: F811
    """The unary Lookup checks its hashes as LookupChains does (docs/contracts.md, the KV store RPCs)."""
    hashes_ = [bytes(31)] if bad == "hash" else [bytes(32)] * (MAX_LOOKUP_HASHES + 1)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.Lookup(kvstore_pb2.LookupRequest(spec=SPEC_PB, block_hashes=hashes_), timeout=TIMEOUT)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert ("32 bytes" if bad == "hash" else "at most 65536") in caught.value.details()
