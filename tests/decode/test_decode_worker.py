"""The decode worker over real gRPC on 127.0.0.1:0: generation, validation, abort, fallback, PushKv frames."""

from __future__ import annotations

import asyncio
import gc
import weakref

import grpc
import pytest
import torch

from kvmesh.decode.receive import PendingKv
from kvmesh.engine.sampling import SamplingParams
from kvmesh.runtime import kvwire
from kvmesh.worker import kvtensor
from kvmesh.runtime.pb import common_pb2, decode_pb2

from .helpers import BLOCK_SIZE, PROMPT, collect, generate_request, greedy, make_reference


async def test_local_prefill_matches_the_engine_greedy_tokens(decode, stub, reference) -> None:
    tokens, replies = await collect(stub, generate_request(max_tokens=6))
    assert tokens == greedy(reference, PROMPT, 6)
    last = replies[-1]
    assert last.finish_reason == "length"
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (len(PROMPT), 6)
    assert all(not r.finish_reason for r in replies[:-1])
    assert decode.worker.counters.local_prefills == 1
    assert decode.worker.counters.remote_prefills == 0


async def test_a_repeated_prompt_reports_cached_tokens(decode, stub) -> None:
    await collect(stub, generate_request(max_tokens=2))
    _, replies = await collect(stub, generate_request(max_tokens=2))
    assert replies[-1].usage.cached_tokens == (len(PROMPT) - 1) // BLOCK_SIZE * BLOCK_SIZE


@pytest.mark.parametrize(
    "request_,words",
    [
        (generate_request(prompt=[]), "empty"),
        (generate_request(prompt=[1] * 48), "48 tokens"),
        (generate_request(prompt=[999]), "token ids"),
    ],
)
async def test_bad_requests_are_invalid_argument(stub, request_, words: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await collect(stub, request_)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert words in err.value.details()


async def test_bad_sampling_is_invalid_argument(stub) -> None:
    request = generate_request()
    request.sampling.temperature = -1.0
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await collect(stub, request)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "temperature" in err.value.details()


async def _wait_idle(decode) -> None:
    for _ in range(200):
        s = decode.loop.stats
        if s.num_running == 0 and s.num_waiting == 0 and s.num_free_blocks == s.num_total_blocks and not decode.worker.num_inflight:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"engine still busy: {decode.loop.stats}")


async def test_abort_ends_the_stream_and_frees_the_slot(decode, stub) -> None:
    call = stub.Generate(generate_request(max_tokens=40, request_id="r-abort"), timeout=30)
    first = await call.read()
    assert first.token_ids
    reply = await stub.Abort(decode_pb2.AbortRequest(request_id="r-abort"), timeout=5)
    assert reply.found
    rest = []
    while (msg := await call.read()) is not grpc.aio.EOF:
        rest.append(msg)
    assert rest[-1].finish_reason == "abort"
    await _wait_idle(decode)
    assert not (await stub.Abort(decode_pb2.AbortRequest(request_id="r-abort"), timeout=5)).found


async def test_client_cancel_frees_the_slot(decode, stub) -> None:
    call = stub.Generate(generate_request(max_tokens=40), timeout=30)
    await call.read()
    call.cancel()
    await _wait_idle(decode)


async def test_unreachable_prefill_worker_falls_back_to_local(decode, stub, reference) -> None:
    request = generate_request(max_tokens=4, prefill=common_pb2.WorkerRef(endpoint="127.0.0.1:1"))
    tokens, _ = await collect(stub, request)
    assert tokens == greedy(reference, PROMPT, 4)
    assert decode.worker.counters.prefill_fallbacks == 1
    assert decode.worker.counters.local_prefills == 1


async def test_draining_worker_refuses_new_requests(decode, stub) -> None:
    await decode.deregister()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await collect(stub, generate_request())
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def _open(decode, request_id: str = "r-push", **fields) -> decode_pb2.KvPushMessage:
    msg = decode_pb2.KvPushOpen(request_id=request_id, spec=decode.worker.spec, num_tokens=12, start_block=0)
    for k, v in fields.items():
        if k == "spec":
            msg.spec.CopyFrom(v)
        else:
            setattr(msg, k, v)
    return decode_pb2.KvPushMessage(open=msg)


def _pending(decode, request_id: str = "r-push") -> PendingKv:
    hashes = decode.worker.hasher.hashes(PROMPT[:12])
    return decode.worker.receiver.register(PendingKv(request_id, 12, 0, BLOCK_SIZE, hashes))


def _block(decode, index: int = 0, **header) -> decode_pb2.KvPushMessage:
    spec = decode.worker.spec
    kv = torch.randn(2, spec.num_layers, BLOCK_SIZE, spec.num_kv_heads, spec.head_dim)
    hashes = decode.worker.hasher.hashes(PROMPT[:12])
    block = kvtensor.encode_block(kv, block_hash=hashes[index], block_index=index)
    for k, v in header.items():
        setattr(block.header, k, v)
    return decode_pb2.KvPushMessage(block=block)


async def _push(stub, messages) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.PushKv(iter(messages), timeout=5)
    return err.value


async def test_push_without_open_is_invalid(decode, stub) -> None:
    err = await _push(stub, [decode_pb2.KvPushMessage(close=decode_pb2.KvPushClose())])
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_push_with_a_foreign_model_spec_is_invalid(decode, stub) -> None:
    _pending(decode)
    spec = common_pb2.ModelSpec()
    spec.CopyFrom(decode.worker.spec)
    spec.head_dim += 1
    err = await _push(stub, [_open(decode, spec=spec)])
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "head_dim" in err.details()


async def test_push_for_an_unknown_request_is_not_found(decode, stub) -> None:
    err = await _push(stub, [_open(decode, request_id="nobody")])
    assert err.code() == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize(
    "bad,words",
    [
        (dict(checksum=1), "checksum"),
        (dict(block_index=1), "out of order"),
        (dict(dtype="float16"), "dtype"),
        (dict(block_hash=b"\0" * 32), "hash"),
    ],
)
async def test_bad_block_frames_are_invalid_and_fail_the_receive(decode, stub, bad: dict, words: str) -> None:
    pending = _pending(decode)
    err = await _push(stub, [_open(decode), _block(decode, **bad)])
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert words in err.details()
    assert pending.error is not None and pending.num_received == 0


async def test_a_push_closed_short_is_invalid(decode, stub) -> None:
    pending = _pending(decode)
    close = decode_pb2.KvPushMessage(close=decode_pb2.KvPushClose(num_blocks=1))
    err = await _push(stub, [_open(decode), _block(decode), close])
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert not pending.complete


def test_handed_in_kv_is_not_held_once_it_is_in_the_cache() -> None:
    """Issue 16 item 5: `computed_kv` is written into the KV cache on admission and then let go,
    not held for the request's lifetime.

    NOTE: an engine of its own: the zeros it hands in land in the prefix cache under PROMPT's
    blocks, and the session's `reference` then answered PROMPT from them (other tests' greedy
    tokens differed whenever one ran after this in the same pytest worker)."""
    engine = make_reference()
    a = engine.model_args
    kv = torch.zeros((2, a.num_layers, len(PROMPT) - 1, a.num_kv_heads, a.head_dim), dtype=engine.dtype)
    alive = weakref.ref(kv)
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    engine.add_request("handed-in", PROMPT, params, computed_kv=kv)
    del kv
    engine.step()
    gc.collect()
    try:
        assert engine.has_unfinished_requests()  # still running...
        assert alive() is None  # ...without its handed-in KV
    finally:
        while engine.has_unfinished_requests():
            engine.step()


async def test_pushed_blocks_are_decoded_off_the_event_loop_into_one_buffer(decode, stub, monkeypatch) -> None:
    """Issue 16 items 4 and 5: crc, copies and dequantization of a pushed block run on the codec
    pool, not the event loop's thread; the blocks land in one prompt-sized buffer in order."""
    import threading

    threads: list[str] = []
    decode_block = kvtensor.decode_block
    decode_into = kvtensor.decode_block_into

    def spy(block, spec, out):
        threads.append(threading.current_thread().name)
        return decode_into(block, spec, out)

    monkeypatch.setattr(kvtensor, "decode_block_into", spy)
    pending = _pending(decode)
    blocks = [_block(decode, i) for i in range(3)]
    close = decode_pb2.KvPushMessage(close=decode_pb2.KvPushClose(num_blocks=3))
    reply = await stub.PushKv(iter([_open(decode), *blocks, close]), timeout=5)
    assert reply.blocks_received == 3 and pending.complete
    assert threads and all(name.startswith("kv-codec") for name in threads)
    assert tuple(pending.kv.shape[2:3]) == (12,)
    for i, msg in enumerate(blocks):
        want = decode_block(msg.block, decode.worker.spec)
        assert torch.equal(pending.kv[:, :, i * BLOCK_SIZE:(i + 1) * BLOCK_SIZE], want)


async def test_a_push_frame_that_does_not_parse_is_invalid(decode) -> None:
    pending = _pending(decode)
    async with grpc.aio.insecure_channel(decode.endpoint) as channel:
        raw = channel.stream_unary("/kvmesh.v1.DecodeWorker/PushKv", request_serializer=None,
                                   response_deserializer=decode_pb2.PushKvResponse.FromString)
        with pytest.raises(grpc.aio.AioRpcError) as err:  # a block field whose length runs past the end
            await raw(iter([_open(decode).SerializeToString(), b"\x12\xff\xff\xff\x0f\x00"]), timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "malformed" in err.value.details()
    assert pending.error is not None and pending.num_received == 0


async def test_pushed_frames_are_parsed_off_the_event_loop(decode, stub, monkeypatch) -> None:
    """A 2 MiB block's parse, and each read of its payload, is a copy (~0.2 ms): PushKv's frames
    come as bytes and are parsed on the codec pool, after the open."""
    import threading

    from kvmesh.decode import receive

    threads: list[str] = []
    parse = receive.parse_push

    def spy(frame):
        threads.append(threading.current_thread().name)
        return parse(frame)

    monkeypatch.setattr(receive, "parse_push", spy)
    pending = _pending(decode)
    close = decode_pb2.KvPushMessage(close=decode_pb2.KvPushClose(num_blocks=3))
    reply = await stub.PushKv(iter([_open(decode), *(_block(decode, i) for i in range(3)), close]), timeout=5)
    assert reply.blocks_received == 3 and pending.complete
    assert len(threads) == 4 and all(name.startswith("kv-codec") for name in threads)  # the blocks and the close
