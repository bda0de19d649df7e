"""The prefill worker's request path: cached prefix from the store, compute the rest, push as produced.

The engine runs each request with `prefill_only=True`; right after every step that advanced it
(on the engine thread) the newly completed blocks are exported, and the asyncio side encodes and
sends them on the PushKv stream to the destination decode worker while later chunks compute.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc

from kvmesh.engine.sampling import SamplingParams
from kvmesh.runtime import kvwire, pbframe
from kvmesh.worker import kvtensor
from kvmesh.runtime.errors import InvalidArgument, Unavailable
from kvmesh.runtime.grpcutil import ChannelPool
from kvmesh.runtime.offload import Offload
from kvmesh.runtime.pb import common_pb2, decode_pb2
from kvmesh.runtime.telemetry import inject_metadata, tracer
from kvmesh.worker.storereader import StoreReader
from kvmesh.worker.worker import EngineLoop

from . import metrics

log = logging.getLogger(__name__)

PUSH_METHOD = "/kvmesh.v1.DecodeWorker/PushKv"
_BLOCK_IN_PUSH = pbframe.key(2)  # KvPushMessage.block: a block's frame is the whole push message


@dataclass(slots=True)
class PrefillJob:
    request_id: str
    prompt: list[int]
    destination: str  # decode worker endpoint
    start_block: int = 0
    encoding: int = kvwire.RAW


@dataclass(slots=True)
class PrefillResult:
    num_computed_tokens: int
    num_cached_tokens: int
    blocks_pushed: int
    bytes_pushed: int


class _Exporter:
    """Runs on the engine thread after each step: the blocks completed since the last call."""

    def __init__(self, engine_id: str, num_tokens: int, block_size: int, start_block: int) -> None:
        self.engine_id = engine_id
        self.num_tokens = num_tokens
        self.block_size = block_size
        self.next_block = start_block

    def __call__(self, engine, out) -> tuple[list, object]:
        n, bs = self.num_tokens, self.block_size
        done = min(out.num_computed_tokens, n)
        upto = -(-n // bs) if done >= n else done // bs
        blocks = [(i, engine.export_kv(self.engine_id, i * bs, min((i + 1) * bs, n))) for i in range(self.next_block, upto)]
        self.next_block = max(self.next_block, upto)
        return blocks, out


class PrefillWorker:
    def __init__(
        self, loop: EngineLoop, spec: common_pb2.ModelSpec, channels: ChannelPool,
        store: StoreReader | None = None, push_timeout_s: float = 30.0, kv_encoding: int = kvwire.RAW,
        codec: Offload | None = None, outbox_blocks: int = 8,
    ) -> None:
        self.loop = loop
        self.spec = spec
        self.channels = channels
        self.store = store
        self.push_timeout_s = push_timeout_s
        self.kv_encoding = kv_encoding
        self.block_size = loop.engine.block_size
        self.hasher = loop.engine.hasher
        self.max_model_len = loop.engine.max_model_len
        self.draining = False
        self.inflight = 0
        self.codec = codec or kvtensor.codec_pool()
        self.outbox_blocks = outbox_blocks

    def validate(self, job: PrefillJob) -> None:
        if self.draining:
            raise Unavailable("prefill worker is draining; retry on another worker")
        if not job.prompt:
            raise InvalidArgument("prompt_token_ids must not be empty")
        if len(job.prompt) >= self.max_model_len:
            raise InvalidArgument(f"prompt has {len(job.prompt)} tokens; the context is {self.max_model_len} tokens")
        if not job.destination:
            raise InvalidArgument("destination endpoint must be set")
        num_blocks = -(-(len(job.prompt) - 1) // self.block_size)
        if job.start_block > num_blocks:
            raise InvalidArgument(f"start_block {job.start_block} is past the prompt's {num_blocks} KV blocks")
        if (job.encoding or kvwire.RAW) not in kvwire.ENCODING_NAMES:
            raise InvalidArgument(f"unknown KV encoding {job.encoding}")

    async def prefill(self, job: PrefillJob) -> PrefillResult:
        """Compute the prompt's KV (all but the last token) and push blocks >= start_block."""
        self.validate(job)
        self.inflight += 1
        try:
            with tracer.start_as_current_span("prefill.compute", attributes={"request_id": job.request_id}) as span:
                result = await self._run(job)
                span.set_attribute("tokens_computed", result.num_computed_tokens)
                span.set_attribute("tokens_cached", result.num_cached_tokens)
                return result
        finally:
            self.inflight -= 1

    async def drain(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self.inflight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    async def _import_from_store(self, prompt: list[int], hashes: list[bytes]) -> int:
        if self.store is None or not hashes:
            return 0
        local = await self.loop.call(lambda engine: engine.cached_prefix_blocks(prompt))
        blocks = await self.store.fetch(hashes, local)
        if not blocks:
            return 0
        return await self.loop.call(lambda engine: engine.import_cached_blocks(prompt, blocks, local))

    async def _run(self, job: PrefillJob) -> PrefillResult:
        bs, prompt = self.block_size, job.prompt
        num_tokens = len(prompt) - 1
        hashes = self.hasher.hashes(prompt[:num_tokens])
        from_store = await self._import_from_store(prompt, hashes)
        engine_id = f"{job.request_id}/{uuid.uuid4().hex[:8]}"
        params = SamplingParams(temperature=0.0, max_tokens=1)
        try:
            stream = await self.loop.add_request(
                engine_id,
                lambda engine: engine.add_request(engine_id, prompt, params, prefill_only=True),
                _Exporter(engine_id, num_tokens, bs, job.start_block),
            )
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from exc
        # NOTE: bounded: a decode worker that reads slowly holds the prefill back (backpressure),
        # instead of encoded blocks piling up here.
        outbox: asyncio.Queue = asyncio.Queue(maxsize=self.outbox_blocks)
        open_msg = decode_pb2.KvPushOpen(
            request_id=job.request_id, spec=self.spec, num_tokens=num_tokens, start_block=job.start_block
        )
        push = self.channels.get(job.destination).stream_unary(  # NOTE: frames serialized on the codec pool
            PUSH_METHOD, request_serializer=None, response_deserializer=decode_pb2.PushKvResponse.FromString)
        encoding = job.encoding or self.kv_encoding
        label = kvwire.encoding_name(encoding)
        finished, pushed, nbytes, cached = False, 0, 0, 0
        with tracer.start_as_current_span("kv.push", attributes={"encoding": label, "destination": job.destination}) as span:
            call = push(_messages(open_msg, outbox), timeout=self.push_timeout_s, metadata=inject_metadata())
            reply = asyncio.ensure_future(call)
            try:
                while not finished:
                    for blocks, out in await stream.next_batch():
                        for index, kv in blocks:
                            block_hash = hashes[index] if kv.shape[2] == bs else b""
                            # NOTE: crc, quantization and serializing on the codec pool, not the event loop
                            frame, size = await self.codec.run(kvtensor.encode_frame, kv, encoding=encoding,
                                                               block_hash=block_hash, block_index=index, wrap=_BLOCK_IN_PUSH)
                            if not await _put(outbox, frame, reply):
                                break
                            pushed, nbytes = pushed + 1, nbytes + size
                        if out.finished:
                            finished, cached = True, out.num_cached_tokens
                    if reply.done():
                        break  # the decode side ended the push early; its status is raised below
                close = decode_pb2.KvPushMessage(close=decode_pb2.KvPushClose(num_blocks=pushed)).SerializeToString()
                if await _put(outbox, close, reply):
                    await _put(outbox, None, reply)
                await reply
            except grpc.aio.AioRpcError as exc:
                raise Unavailable(f"KV push to {job.destination} failed: {exc.code().name} {exc.details()}") from exc
            finally:
                if not reply.done():
                    reply.cancel()
                if finished:
                    self.loop.call_nowait(lambda engine: engine.release(engine_id))
                else:
                    self.loop.cancel(engine_id)
            if not finished:
                raise Unavailable(f"KV push to {job.destination} ended before the prefill finished")
            span.set_attribute("blocks", pushed)
            span.set_attribute("bytes", nbytes)
        metrics.KV_BLOCKS_PUSHED.labels(label).inc(pushed)
        metrics.KV_BYTES_PUSHED.labels(label).inc(nbytes)
        store_tokens = min(from_store * bs, cached)
        metrics.CACHED_TOKENS.labels("store").inc(store_tokens)
        metrics.CACHED_TOKENS.labels("local").inc(cached - store_tokens)
        metrics.COMPUTED_TOKENS.inc(num_tokens - cached)
        return PrefillResult(num_tokens - cached, cached, pushed, nbytes)


async def _put(outbox: asyncio.Queue, msg: bytes | None, reply: asyncio.Future) -> bool:
    """Waits for room in the push's bounded outbox; False when the push call ended first."""
    if reply.done():
        return False
    put = asyncio.ensure_future(outbox.put(msg))
    await asyncio.wait({put, reply}, return_when=asyncio.FIRST_COMPLETED)
    if not put.done():
        put.cancel()
        return False
    return True


async def _messages(first: decode_pb2.KvPushOpen, outbox: asyncio.Queue) -> AsyncIterator[bytes]:
    """The push's messages, serialized (PUSH_METHOD has no serializer)."""
    yield decode_pb2.KvPushMessage(open=first).SerializeToString()
    while (msg := await outbox.get()) is not None:
        yield msg
