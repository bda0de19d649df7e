"""A prefill worker pushing KV to a decode worker, both on real gRPC servers on 127.0.0.1:0."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from kvmesh.decode.main import start as start_decode
from kvmesh.prefill.config import PrefillSettings
from kvmesh.prefill.main import start as start_prefill
from kvmesh.runtime import kvwire
from kvmesh.runtime.grpcutil import start_server
from kvmesh.runtime.kvstoremsgs import BlockRun
from kvmesh.runtime.pb import common_pb2, decode_pb2_grpc, kvstore_pb2, kvstore_pb2_grpc, prefill_pb2, prefill_pb2_grpc

from ..decode.helpers import BLOCK_SIZE, PROMPT, collect, decode_settings, generate_request, greedy, make_reference

NUM_BLOCKS = -(-(len(PROMPT) - 1) // BLOCK_SIZE)


def prefill_settings(**overrides) -> PrefillSettings:
    base = dict(
        model="tiny", nats_url="", port=0, metrics_port=-1, block_size=BLOCK_SIZE, num_kv_blocks=64,
        max_num_batched_tokens=4, max_model_len=48, drain_grace_s=0.0, push_timeout_s=10.0, kvstore_timeout_s=0.5,
    )
    return PrefillSettings(**{**base, **overrides})


@pytest.fixture(scope="module")
def reference():
    return make_reference()


@pytest.fixture
async def mesh():
    prefill = await start_prefill(prefill_settings())
    decode = await start_decode(decode_settings())
    async with grpc.aio.insecure_channel(decode.endpoint) as channel:
        yield prefill, decode, decode_pb2_grpc.DecodeWorkerStub(channel)
    await decode.stop()
    await prefill.stop()


def remote(prefill, encoding=kvwire.RAW, **kw):
    return generate_request(prefill=common_pb2.WorkerRef(endpoint=prefill.endpoint), kv_encoding=encoding, **kw)


async def test_pushed_kv_gives_the_engine_tokens_without_local_prefill(mesh, reference) -> None:
    prefill, decode, stub = mesh
    tokens, replies = await collect(stub, remote(prefill, max_tokens=6))
    assert tokens == greedy(reference, PROMPT, 6)
    c = decode.worker.counters
    assert (c.remote_prefills, c.local_prefills, c.prefill_fallbacks) == (1, 0, 0)
    assert c.blocks_received == NUM_BLOCKS
    assert replies[-1].usage.prompt_tokens == len(PROMPT)


async def test_int8_push_sends_fewer_bytes(mesh) -> None:
    prefill, decode, stub = mesh
    await collect(stub, remote(prefill, max_tokens=2, prompt=PROMPT[:9]))
    raw_bytes = decode.worker.counters.bytes_received
    tokens, replies = await collect(stub, remote(prefill, kvwire.INT8, max_tokens=3, prompt=PROMPT[:9][::-1]))
    assert len(tokens) == 3 and replies[-1].finish_reason == "length"
    int8_bytes = decode.worker.counters.bytes_received - raw_bytes
    assert decode.worker.counters.remote_prefills == 2
    assert 0 < int8_bytes < raw_bytes


async def test_blocks_the_decode_worker_holds_are_not_pushed(mesh, reference) -> None:
    prefill, decode, stub = mesh
    await collect(stub, generate_request(max_tokens=1))  # local: the prompt's full blocks are now cached here
    received = decode.worker.counters.blocks_received
    longer = PROMPT + [63, 10, 64, 65]
    tokens, _ = await collect(stub, remote(prefill, max_tokens=4, prompt=longer))
    assert tokens == greedy(reference, longer, 4)
    held = (len(PROMPT)) // BLOCK_SIZE
    assert decode.worker.counters.blocks_received - received == -(-(len(longer) - 1) // BLOCK_SIZE) - held


async def test_unreachable_destination_is_unavailable_and_frees_the_engine(mesh) -> None:
    prefill, _, _ = mesh
    async with grpc.aio.insecure_channel(prefill.endpoint) as channel:
        stub = prefill_pb2_grpc.PrefillWorkerStub(channel)
        request = prefill_pb2.PrefillRequest(
            request_id="r1", prompt_token_ids=PROMPT, destination=common_pb2.WorkerRef(endpoint="127.0.0.1:1")
        )
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Prefill(request, timeout=10)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    for _ in range(100):
        s = prefill.loop.stats
        if s.num_free_blocks == s.num_total_blocks and s.num_running == 0:
            break
        await asyncio.sleep(0.02)
    assert prefill.loop.stats.num_free_blocks == prefill.loop.stats.num_total_blocks


async def test_prefill_validates_its_request(mesh) -> None:
    prefill, _, _ = mesh
    async with grpc.aio.insecure_channel(prefill.endpoint) as channel:
        stub = prefill_pb2_grpc.PrefillWorkerStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Prefill(prefill_pb2.PrefillRequest(request_id="r", prompt_token_ids=PROMPT), timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


class FakeStore(kvstore_pb2_grpc.KvStoreServicer):
    """Holds what was Put (committed), answers Lookup/Get from it."""

    def __init__(self) -> None:
        self.blocks: dict[bytes, common_pb2.KvBlock] = {}
        self.gets = 0

    async def Put(self, request_iterator, context):
        staged, spec = [], None
        async for msg in request_iterator:
            if msg.WhichOneof("msg") == "open":
                spec = msg.open.spec
            elif msg.WhichOneof("msg") == "block":
                staged.append(msg.block)
            elif msg.WhichOneof("msg") == "blocks":
                staged.extend(msg.blocks.blocks)
            elif msg.WhichOneof("msg") == "runs":  # a hand-back's turns (contracts K20)
                for run in msg.runs.runs:
                    staged.extend(BlockRun.of(run.data, list(run.block_hashes), run.first_index).as_blocks(spec))
            elif msg.WhichOneof("msg") == "commit":
                for b in staged:
                    self.blocks[b.header.block_hash] = b
        return kvstore_pb2.PutResponse(stored=len(staged))

    async def Lookup(self, request, context):
        n = 0
        while n < len(request.block_hashes) and request.block_hashes[n] in self.blocks:
            n += 1
        return kvstore_pb2.LookupResponse(num_blocks=n, lease_id="lease")

    async def Get(self, request, context):
        self.gets += 1
        for i, h in enumerate(request.block_hashes):
            block = common_pb2.KvBlock()
            block.CopyFrom(self.blocks[h])
            block.header.block_index = i
            yield block


async def test_finished_turns_go_to_the_store_and_come_back_as_a_cached_prefix(reference) -> None:
    fake = FakeStore()
    server = await start_server("127.0.0.1", 0, [(kvstore_pb2_grpc.add_KvStoreServicer_to_server, fake, "kvmesh.v1.KvStore")])
    store = f"127.0.0.1:{server.port}"
    first = await start_decode(decode_settings(kvstore=store))
    try:
        async with grpc.aio.insecure_channel(first.endpoint) as channel:
            await collect(decode_pb2_grpc.DecodeWorkerStub(channel), generate_request(max_tokens=4))
        for _ in range(100):
            if first.worker.handback.blocks_stored:
                break
            await asyncio.sleep(0.02)
        assert len(fake.blocks) == (len(PROMPT) + 4 - 1) // BLOCK_SIZE
    finally:
        await first.stop()
    prefill = await start_prefill(prefill_settings(kvstore=store))
    second = await start_decode(decode_settings())
    try:
        async with grpc.aio.insecure_channel(second.endpoint) as channel:
            tokens, replies = await collect(decode_pb2_grpc.DecodeWorkerStub(channel), remote(prefill, max_tokens=5))
        assert tokens == greedy(reference, PROMPT, 5)
        assert fake.gets == 1
        assert second.worker.counters.remote_prefills == 1
    finally:
        await second.stop()
        await prefill.stop()
        await server.stop(0)


async def test_a_down_store_only_means_computing(reference) -> None:
    prefill = await start_prefill(prefill_settings(kvstore="127.0.0.1:1"))
    decode = await start_decode(decode_settings())
    try:
        async with grpc.aio.insecure_channel(decode.endpoint) as channel:
            tokens, _ = await collect(decode_pb2_grpc.DecodeWorkerStub(channel), remote(prefill, max_tokens=3))
        assert tokens == greedy(reference, PROMPT, 3)
        assert decode.worker.counters.remote_prefills == 1
        assert prefill.worker.store.failures == 1
    finally:
        await decode.stop()
        await prefill.stop()


async def test_the_push_outbox_is_bounded_and_gives_up_when_the_push_ends() -> None:
    """Issue 16 item 5: a full outbox makes the prefill wait (backpressure) instead of growing;
    when the decode side ends the push meanwhile, the wait ends instead of hanging."""
    import asyncio

    from kvmesh.prefill.worker import _put

    outbox: asyncio.Queue = asyncio.Queue(maxsize=1)
    reply = asyncio.get_running_loop().create_future()
    assert await _put(outbox, "first", reply)
    waiting = asyncio.ensure_future(_put(outbox, "second", reply))
    await asyncio.sleep(0.05)
    assert not waiting.done() and outbox.qsize() == 1  # held back, not queued
    reply.set_result(None)
    assert await asyncio.wait_for(waiting, 1.0) is False


async def test_blocks_read_from_the_store_are_parsed_on_the_codec_pool(monkeypatch) -> None:
    """A Get's answers reach the client as bytes with only their header read
    (`kvwire.read_frame`); the whole block is parsed (a copy of its payload) on the codec pool."""
    import threading

    import torch

    from kvmesh.runtime.kvshardclient import ShardedStore
    from kvmesh.runtime.kvshards import Shard, ShardDirectory
    from kvmesh.runtime.grpcutil import ChannelPool
    from kvmesh.worker import kvtensor
    from kvmesh.worker.storereader import StoreReader

    spec = common_pb2.ModelSpec(model_id="m", dtype="float32", block_size=4, num_layers=2, num_kv_heads=2, head_dim=8)
    kvs = [torch.randn(2, 2, 4, 2, 8) for _ in range(3)]
    hashes = [bytes([i]) * 32 for i in range(3)]
    fake = FakeStore()
    fake.blocks = {h: kvtensor.encode_block(kv, block_hash=h, block_index=i) for i, (h, kv) in enumerate(zip(hashes, kvs))}
    threads: list[str] = []
    parse = kvwire.BlockFrame.block

    def spy(self):
        threads.append(threading.current_thread().name)
        return parse(self)

    monkeypatch.setattr(kvwire.BlockFrame, "block", spy)
    server = await start_server("127.0.0.1", 0, [(kvstore_pb2_grpc.add_KvStoreServicer_to_server, fake, "kvmesh.v1.KvStore")])
    pool = ChannelPool()
    try:
        store = ShardedStore(ShardDirectory([Shard("s", f"127.0.0.1:{server.port}")]), pool, spec, 10.0)
        got = await StoreReader(store, spec).read(hashes, 1)
        assert [torch.equal(a, b) for a, b in zip(got, kvs[1:])] == [True, True]
        assert len(threads) == 2 and all(name.startswith("kv-codec") for name in threads)
    finally:
        await pool.close()
        await server.stop(0)
