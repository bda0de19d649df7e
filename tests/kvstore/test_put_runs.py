"""Put with `runs` messages (KvBlockRun: a decode worker's turn as one payload, the turns handed
back together in one message): the same store as `blocks` messages, the sender's byte bound, a run split across shards, bad runs refused with
INVALID_ARGUMENT, and a store older than KvBlockRun sent the same blocks as KvBlocks."""

from __future__ import annotations

from dataclasses import replace

import grpc
import pytest

from kvmesh.kvstore.blocks import Encoding, blocks_of_run, expected_lengths
from kvmesh.kvstore.puts import PutSessions
from kvmesh.kvstore.server import KvStoreServicer, block_to_pb
from kvmesh.runtime.errors import InvalidArgument
from kvmesh.runtime.kvwire import checksum
from kvmesh.runtime.grpcutil import ChannelPool
from kvmesh.runtime.kvshardclient import ShardedStore
from kvmesh.runtime.kvshards import Shard, ShardDirectory
from kvmesh.runtime.kvstoremsgs import BlockRun, Chain, put_frames, put_messages, runs
from kvmesh.runtime.pb import common_pb2, kvstore_pb2

from .conftest import BLOCK_BYTES, SPEC, chain, h
from .test_put_batches import stored_chain
from .test_server import SPEC_PB, TIMEOUT, lookup, running_factory  # noqa: F401 - fixture

NAMES = ("a1", "a2", "a3", "a4", "a5")


def run_of(names, start: int = 0) -> BlockRun:
    blocks = chain(*names, start=start)
    return BlockRun.of(b"".join(b.data for b in blocks), [h(n) for n in names], start)


def test_a_run_is_the_blocks_it_packs():
    blocks = [block_to_pb(b) for b in chain(*NAMES, start=3)]
    run = run_of(NAMES, start=3)
    assert run.as_blocks(SPEC_PB) == blocks  # checksums, headers and payloads the same as KvBlocks made one by one
    assert run.part(1, 3).as_blocks(SPEC_PB) == blocks[1:3]
    with pytest.raises(ValueError, match="do not split"):
        BlockRun.of(b"x" * 5, [h("a"), h("b")], 0)


def test_runs_go_in_as_few_messages_as_the_byte_bound_allows_and_as_blocks_to_an_old_store():
    run = run_of(NAMES)
    together = put_messages(SPEC_PB, "t", [Chain(run, h("p")), Chain(run_of(["b1", "b2"]), h("a5"))])
    assert [m.WhichOneof("msg") for m in together] == ["open", "runs", "commit"]
    assert [(len(r.block_hashes), r.new_chain, r.parent_hash) for r in together[1].runs.runs] == [(5, False, b""), (2, True, h("a5"))]
    split = put_messages(SPEC_PB, "t", [Chain(run_of(["z"])), Chain(run, h("p"))], 2 * BLOCK_BYTES)
    assert [[(len(r.block_hashes), r.first_index, r.new_chain, r.parent_hash) for r in m.runs.runs] for m in split[1:-1]] == [
        [(1, 0, False, b"")], [(2, 0, True, h("p"))], [(2, 2, False, b"")], [(1, 4, False, b"")]]
    assert split[-1].commit.num_blocks == 6
    packed = put_messages(SPEC_PB, "t", [Chain(run_of(["z"])), Chain(run_of(["y"]), h("z")), Chain(run, h("p"))], 3 * BLOCK_BYTES)
    assert [[len(r.block_hashes) for r in m.runs.runs] for m in packed[1:-1]] == [[1, 1], [3], [2]]
    old = put_messages(SPEC_PB, "t", [Chain(run, h("p"))], runs_ok=False)
    assert [m.WhichOneof("msg") for m in old] == ["open", "blocks", "commit"]
    assert list(old[1].blocks.blocks) == run.as_blocks(SPEC_PB)


def test_put_frames_are_put_messages_serialized_runs_written_by_hand():
    # a run with scales, payloads whose lengths take 1-3 varint bytes, a byte bound that splits
    # runs across messages, several runs in one message, and an old store's `blocks`
    big = BlockRun.of(bytes(range(256)) * 256 * 5, [h(f"g{i}") for i in range(5)], 2, common_pb2.KV_ENCODING_INT8,
                      scales=bytes(range(5)) * 40)
    small = BlockRun.of(b"\x07" * 20, [h("s1"), h("s2")], 0)
    cases = [
        ([Chain(run_of(NAMES), h("p")), Chain(run_of(["b1", "b2"]), h("a5"))], {}),
        ([Chain(big), Chain(small, h("g5"))], {}),
        ([Chain(big, h("p")), Chain(small, h("g5")), Chain(run_of(["z"]))], {"max_bytes": 2 * len(big.data) // 5}),
        ([Chain(run_of(NAMES), h("p"))], {"runs_ok": False}),
    ]
    for chains, kwargs in cases:
        messages = put_messages(SPEC_PB, "t", chains, **kwargs)
        frames = put_frames(SPEC_PB, "t", chains, **kwargs)
        assert [kvstore_pb2.PutMessage.FromString(f) for f in frames] == messages


def test_a_runs_blocks_split_by_shard_keep_their_parents():
    run = run_of(NAMES)
    parts = runs(Chain(run, h("p")), [0, 1, 3])
    assert [(c.blocks.block_hashes, c.parent_hash) for c in parts] == [([h("a1"), h("a2")], h("p")), ([h("a4")], h("a3"))]
    assert parts[1].blocks.first_index == 3 and parts[1].blocks.data == run.data[3 * BLOCK_BYTES:4 * BLOCK_BYTES]
    assert runs(Chain(run, h("p")), list(range(5)))[0].blocks is run


async def test_run_messages_store_what_blocks_messages_store(running_factory):
    batches, stub_a = await running_factory(memory_bytes=16 * BLOCK_BYTES)
    packed, stub_b = await running_factory(memory_bytes=16 * BLOCK_BYTES)
    first, second = run_of(NAMES, start=3), run_of(["b2", "b3"], start=7)
    chains = [Chain(first, h("p")), Chain(second, h("b1"))]
    as_blocks = [Chain(c.blocks.as_blocks(SPEC_PB), c.parent_hash) for c in chains]
    assert await stub_a.Put(iter(put_messages(SPEC_PB, "t", as_blocks)), timeout=TIMEOUT) == kvstore_pb2.PutResponse(stored=7)
    assert await stub_b.Put(iter(put_messages(SPEC_PB, "t", chains, 2 * BLOCK_BYTES)), timeout=TIMEOUT) == \
        kvstore_pb2.PutResponse(stored=7)
    names = [*NAMES, "b2", "b3"]
    assert stored_chain(packed, names) == stored_chain(batches, names)
    assert stored_chain(packed, ["a1", "b2"]) == [(h("a1"), h("p")), (h("b2"), h("b1"))]
    assert [packed.store.index.get((SPEC.namespace, h(n))).block.data for n in names] == \
        [batches.store.index.get((SPEC.namespace, h(n))).block.data for n in names]
    assert (await lookup(stub_b, list(NAMES))).num_blocks == 5


def _bad(**fields) -> BlockRun:
    run = run_of(["a1", "a2"])
    for name, value in fields.items():
        setattr(run, name, value)
    return run


@pytest.mark.parametrize("run, message", [
    (_bad(checksums=[1, 2]), "checksum"),
    (_bad(checksums=[7]), "1 checksums"),
    (_bad(data=b"\0" * (2 * BLOCK_BYTES - 4)), "expected 2 x"),
    (_bad(scales=b"\0" * 8), "scale bytes"),
    (_bad(encoding=99), "unknown KV encoding"),
])
async def test_a_bad_run_is_invalid_and_nothing_is_stored(running_factory, run, message):
    running, stub = await running_factory()
    messages = put_messages(SPEC_PB, "t", [Chain(run_of(["z"])), Chain(run)])
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Put(iter(messages), timeout=TIMEOUT)
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert message in err.value.details()
    assert (await lookup(stub, ["z"])).num_blocks == 0 and running.store.open_puts == 0


class _OldStore(KvStoreServicer):
    """A store from before KvBlockRun: the generated code it was built with reads `runs` as no message."""

    puts: list[list[str]] = []

    async def Put(self, request_iterator, context):
        kinds = []

        async def older():
            async for frame in request_iterator:  # NOTE: the store reads a Put's messages as bytes
                kinds.append(kvstore_pb2.PutMessage.FromString(frame).WhichOneof("msg"))
                if kinds[-1] == "runs":
                    frame = kvstore_pb2.PutMessage().SerializeToString()  # what an older store parses it as
                yield frame

        try:
            return await super().Put(older(), context)
        finally:
            _OldStore.puts.append(kinds)


async def test_a_store_older_than_runs_gets_the_same_blocks_as_kvblocks(running_factory, monkeypatch):
    monkeypatch.setattr("kvmesh.kvstore.main.KvStoreServicer", _OldStore)
    _OldStore.puts = []
    running, stub = await running_factory(memory_bytes=16 * BLOCK_BYTES)
    pool = ChannelPool()
    try:
        spec = common_pb2.ModelSpec()
        spec.CopyFrom(SPEC_PB)
        client = ShardedStore(ShardDirectory([Shard("old", running.endpoint)]), pool, spec, TIMEOUT)
        assert await client.put_chains("t", [Chain(run_of(NAMES), h("p"))]) == (5, 0)
        assert await client.put_chains("t", [Chain(run_of(["b1", "b2"]))]) == (2, 0)
    finally:
        await pool.close()
    assert _OldStore.puts == [["open", "runs"], ["open", "blocks", "commit"], ["open", "blocks", "commit"]]
    assert client.failures == 0 and stored_chain(running, ["a1", "a2"]) == [(h("a1"), h("p")), (h("a2"), h("a1"))]


def _session_blocks(names, start: int = 0):
    run = run_of(names, start)
    return blocks_of_run(SPEC, Encoding.RAW, run.block_hashes, run.checksums, start, run.data, b"")


def test_a_runs_blocks_are_staged_in_order_within_the_put_limit_with_their_own_hashes():
    puts = PutSessions(timeout_s=30.0, max_blocks=4)
    put_id = puts.open(SPEC, "t", None, 0.0).put_id
    puts.stage_run(put_id, _session_blocks(["a1", "a2"]), 0.0)
    with pytest.raises(InvalidArgument, match="block_index 3 does not follow 1"):
        puts.stage_run(put_id, _session_blocks(["a4"], start=3), 0.0)
    with pytest.raises(InvalidArgument, match="more than 4 blocks"):
        puts.stage_run(put_id, _session_blocks(["a3", "a4", "a5"], start=2), 0.0)
    short = _session_blocks(["a3"], start=2)
    short[0] = replace(short[0], header=replace(short[0].header, block_hash=b"\1" * 31))
    with pytest.raises(InvalidArgument, match="block_hash must be 32 bytes"):
        puts.stage_run(put_id, short, 0.0)
    puts.stage_run(put_id, _session_blocks(["a3", "a4"], start=2), 0.0)
    assert [b.header.block_index for b in puts.get(put_id, 0.0).blocks] == [0, 1, 2, 3]


def test_a_runs_block_with_a_wrong_checksum_fails_the_run_scales_included():
    puts = PutSessions(timeout_s=30.0, max_blocks=8)
    put_id = puts.open(SPEC, "t", None, 0.0).put_id
    bad = _session_blocks(["a1", "a2"])
    bad[1] = replace(bad[1], header=replace(bad[1].header, checksum=bad[1].header.checksum ^ 1))
    with pytest.raises(InvalidArgument, match="block 1: checksum mismatch"):
        puts.stage_run(put_id, bad, 0.0)
    data_len, scales_len = expected_lengths(SPEC, Encoding.INT8)
    data, scales = bytes(range(256)) * (2 * data_len // 256 + 1), bytes(range(7, 256)) * (2 * scales_len // 249 + 1)
    data, scales = data[:2 * data_len], scales[:2 * scales_len]
    sums = [checksum(data[i * data_len:(i + 1) * data_len], scales[i * scales_len:(i + 1) * scales_len]) for i in range(2)]
    run = blocks_of_run(SPEC, Encoding.INT8, [h("a1"), h("a2")], sums, 0, data, scales)
    puts.stage_run(put_id, run, 0.0)  # data and scales both counted
    assert [b.header.checksum for b in puts.get(put_id, 0.0).blocks] == sums
    wrong = blocks_of_run(SPEC, Encoding.INT8, [h("a3")], [checksum(data[:data_len])], 2, data[:data_len], scales[:scales_len])
    with pytest.raises(InvalidArgument, match="checksum mismatch"):
        puts.stage_run(put_id, wrong, 0.0)  # the data's crc alone is not the block's


@pytest.mark.parametrize("tail, message", [
    (b"\x2a\xff\xff\xff\x0f", "malformed request message"),  # a runs field whose length runs past the end
    (kvstore_pb2.PutMessage(open=kvstore_pb2.PutOpen(producer_id="x")).SerializeToString(), "starts as runs but is open"),
])
async def test_a_put_message_that_does_not_parse_as_it_starts_is_invalid(running_factory, tail, message):
    """The store reads a Put's messages as bytes, tells their kind by the first key and parses the
    block messages on its store thread: a frame that parses otherwise (or not at all) is refused."""
    running, stub = await running_factory()
    good = put_frames(SPEC_PB, "t", [Chain(run_of(["z"]))])
    first_runs = good[1]
    assert first_runs[:1] == b"\x2a"
    async with grpc.aio.insecure_channel(running.endpoint) as channel:
        raw = channel.stream_unary("/kvmesh.v1.KvStore/Put", request_serializer=None,
                                   response_deserializer=kvstore_pb2.PutResponse.FromString)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await raw(iter([good[0], first_runs + tail, *good[2:]]), timeout=TIMEOUT)
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert message in err.value.details()
    assert (await lookup(stub, ["z"])).num_blocks == 0 and running.store.open_puts == 0


async def test_a_puts_block_messages_are_parsed_on_the_store_thread(running_factory, monkeypatch):
    import threading

    from kvmesh.kvstore import server

    threads: list[str] = []
    parse = server.parse_put

    def spy(frame, kind):
        threads.append((kind, threading.current_thread() is threading.main_thread()))
        return parse(frame, kind)

    monkeypatch.setattr(server, "parse_put", spy)
    running, stub = await running_factory()
    assert (await stub.Put(iter(put_messages(SPEC_PB, "t", [Chain(run_of(NAMES))])), timeout=TIMEOUT)).stored == 5
    assert threads == [("open", True), ("commit", True), ("runs", False)]  # staged by the commit's trip
