"""Put with `blocks` messages (KvBlockBatch): the same store as single-block messages, several
chains in one Put, the sender's byte bound, and bad input refused with INVALID_ARGUMENT."""

from __future__ import annotations

import grpc
import pytest

from kvmesh.kvstore.server import block_to_pb
from kvmesh.runtime.kvstoremsgs import Chain, put_messages
from kvmesh.runtime.pb import kvstore_pb2

from .conftest import BLOCK_BYTES, SPEC, block, chain, h
from .test_server import SPEC_PB, TIMEOUT, corrupt, lookup, put, running_factory  # noqa: F401 - fixture

NAMES = ("a1", "a2", "a3", "a4", "a5")


def batched(chains: list[Chain], max_bytes: int = 4 * 1024 * 1024, commit: int | None = None) -> list[kvstore_pb2.PutMessage]:
    messages = put_messages(SPEC_PB, "t", chains, max_bytes)
    if commit is not None:
        messages[-1].commit.num_blocks = commit
    return messages


def stored_chain(running, names) -> list[tuple[bytes, bytes | None]]:
    """(hash, parent) of each named block as the store holds it."""
    entries = [running.store.index.get((SPEC.namespace, h(n))) for n in names]
    return [(e.key[1], e.parent) for e in entries]


def test_a_turn_goes_in_as_few_messages_as_the_byte_bound_allows():
    blocks = [block_to_pb(b) for b in chain(*NAMES)]
    kinds = [m.WhichOneof("msg") for m in batched([Chain(blocks, h("p"))])]
    assert kinds == ["open", "blocks", "commit"]
    split = batched([Chain(blocks, h("p"))], max_bytes=2 * BLOCK_BYTES)
    assert [len(m.blocks.blocks) for m in split[1:-1]] == [2, 2, 1]
    assert not any(m.blocks.new_chain for m in split[1:-1]) and split[0].open.parent_hash == h("p")
    assert split[-1].commit.num_blocks == 5
    alone = batched([Chain(blocks[:2])], max_bytes=BLOCK_BYTES // 2)  # a block over the bound travels alone
    assert [len(m.blocks.blocks) for m in alone[1:-1]] == [1, 1]


async def test_blocks_messages_store_what_block_messages_store(running_factory):
    singles, stub_a = await running_factory(memory_bytes=16 * BLOCK_BYTES)
    batches, stub_b = await running_factory(memory_bytes=16 * BLOCK_BYTES)
    blocks = chain(*NAMES, start=3)
    assert await put(stub_a, blocks, parent=h("p")) == kvstore_pb2.PutResponse(stored=5)
    reply = await stub_b.Put(iter(batched([Chain([block_to_pb(b) for b in blocks], h("p"))], max_bytes=2 * BLOCK_BYTES)),
                             timeout=TIMEOUT)
    assert reply == kvstore_pb2.PutResponse(stored=5)
    assert stored_chain(batches, NAMES) == stored_chain(singles, NAMES) == list(zip([h(n) for n in NAMES], [h("p"), *[h(n) for n in NAMES[:-1]]]))
    assert batches.store.drain_events() == singles.store.drain_events() == []  # both published (nowhere: no NATS)


async def test_a_new_chain_batch_links_to_its_own_parent(running_factory):
    running, stub = await running_factory(memory_bytes=16 * BLOCK_BYTES)
    first = Chain([block_to_pb(b) for b in chain("a1", "a2")])
    second = Chain([block_to_pb(b) for b in chain("b2", "b3", start=7)], h("b1"))
    messages = batched([first, second])
    assert [m.blocks.new_chain for m in messages[1:-1]] == [False, True] and messages[2].blocks.parent_hash == h("b1")
    reply = await stub.Put(iter(messages), timeout=TIMEOUT)
    assert (reply.stored, reply.duplicates) == (4, 0)
    assert stored_chain(running, ["a1", "a2", "b2", "b3"]) == [(h("a1"), None), (h("a2"), h("a1")), (h("b2"), h("b1")), (h("b3"), h("b2"))]
    assert (await lookup(stub, ["b2", "b3"])).num_blocks == 2


@pytest.mark.parametrize("blocks, commit, message", [
    ([block_to_pb(block("a1")), block_to_pb(block("a2", 1))], 3, "commit says 3"),
    ([block_to_pb(block("a1")), corrupt(block("a2", 1), checksum=1)], None, "checksum"),
    ([block_to_pb(block("a1")), corrupt(block("a2", 1), shape=[2, 1, 4, 2, 4])], None, "shape"),
])
async def test_a_bad_batch_is_invalid_and_nothing_is_stored(running_factory, blocks, commit, message):
    _, stub = await running_factory()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Put(iter(batched([Chain(blocks)], commit=commit)), timeout=TIMEOUT)
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert message in err.value.details()
    assert (await lookup(stub, ["a1"])).num_blocks == 0


async def test_a_batch_of_another_spec_or_a_bad_chain_parent_is_invalid(running_factory):
    _, stub = await running_factory()
    other = batched([Chain([block_to_pb(block("a1"))])])
    other[0].open.spec.num_layers = 1
    bad_parent = batched([Chain([block_to_pb(block("a1"))]), Chain([block_to_pb(block("b1"))], b"short")])
    for messages, text in ((other, "shape"), (bad_parent, "parent_hash")):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Put(iter(messages), timeout=TIMEOUT)
        assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT and text in err.value.details()
    assert (await lookup(stub, ["a1"])).num_blocks == 0
