"""The decode worker's request path: remote (or local) prefill, then streamed generation.

`start(job, deliver)` asks the named prefill worker to push the prompt's KV here (falling back to
a local prefill if it fails) and adds the sequence to the engine with that KV; the engine thread
then hands each step's outputs to `deliver` on the event loop. The multiplexed token stream
(`stream.py`) and the one-request-per-call `Generate` RPC (`generate.py`) are built on it.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from opentelemetry import trace

from kvmesh.engine.outputs import ContextLengthError, RequestOutput
from kvmesh.engine.sampling import SamplingParams
from kvmesh.runtime import kvwire
from kvmesh.runtime.errors import InvalidArgument, MeshError, ResourceExhausted, Unavailable
from kvmesh.runtime.grpcutil import ChannelPool
from kvmesh.runtime.offload import Offload
from kvmesh.runtime.pb import common_pb2, prefill_pb2, prefill_pb2_grpc
from kvmesh.runtime.telemetry import inject_metadata
from kvmesh.worker import kvtensor
from kvmesh.worker.engineproc import EngineProcess
from kvmesh.worker.worker import EngineLoop

from . import commands, metrics
from .handback import Handback
from .receive import KvReceiver, PendingKv, parse_push, read_push

log = logging.getLogger(__name__)


@dataclass(slots=True)
class GenerateJob:
    request_id: str
    prompt: list[int]
    params: SamplingParams
    prefill_endpoint: str = ""  # empty = prefill locally
    kv_encoding: int = 0  # KvEncoding; 0 = this worker's default
    detokenize: bool = True  # False on the token stream: token ids only, the client makes the text


@dataclass(slots=True)
class DecodeCounters:
    remote_prefills: int = 0
    local_prefills: int = 0
    prefill_fallbacks: int = 0
    blocks_received: int = 0
    bytes_received: int = 0


@dataclass(slots=True)
class _Inflight:
    job: GenerateJob
    tokens: list[int]  # prompt + output so far (for the KV hand-back)
    engine_id: str  # this call's id inside the engine: never shared with an earlier call of the same request id
    aborted: bool = False
    in_engine: bool = False


@dataclass(slots=True)
class _Received:
    start_block: int
    kv: Any  # [2, L, num_tokens, H, D]: received blocks in place, the local prefix still to copy in


class DecodeWorker:
    def __init__(
        self, loop: EngineLoop | EngineProcess, spec: common_pb2.ModelSpec, worker_id: str, endpoint: str,
        channels: ChannelPool, prefill_timeout_s: float = 30.0, handback: Handback | None = None,
        kv_encoding: int = kvwire.RAW, codec: Offload | None = None,
    ) -> None:
        self.loop = loop
        self.spec = spec
        self.worker_id = worker_id
        self.endpoint = endpoint
        self.channels = channels
        self.prefill_timeout_s = prefill_timeout_s
        self.handback = handback
        self.kv_encoding = kv_encoding
        self.receiver = KvReceiver()
        self.codec = codec or kvtensor.codec_pool()
        self.counters = DecodeCounters()
        self.draining = False
        self.block_size = loop.engine.block_size
        self.hasher = loop.engine.hasher
        self.max_model_len = loop.engine.max_model_len
        self.max_num_seqs = loop.engine.config.max_num_seqs
        self._inflight: dict[str, _Inflight] = {}
        self._starts = itertools.count()

    @property
    def num_inflight(self) -> int:
        return len(self._inflight)

    def live_request_ids(self) -> list[str]:
        """The request ids this worker holds (prefilling, waiting or running): heartbeat `live_requests`."""
        return list(self._inflight)

    def validate(self, job: GenerateJob) -> None:
        if self.draining:
            raise Unavailable("decode worker is draining; retry on another worker")
        if not job.prompt:
            raise InvalidArgument("prompt_token_ids must not be empty")
        try:
            job.params.validate()
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from exc
        vocab = self.loop.engine.model_args.vocab_size
        if any(t < 0 or t >= vocab for t in job.prompt):
            raise InvalidArgument(f"prompt token ids must be in [0, {vocab})")
        if len(job.prompt) >= self.max_model_len:
            raise InvalidArgument(str(ContextLengthError(len(job.prompt), self.max_model_len)))
        stats = self.loop.stats
        if stats.num_waiting >= self.max_num_seqs or len(self._inflight) >= 4 * self.max_num_seqs:
            raise ResourceExhausted(f"decode worker is full ({stats.num_waiting} requests waiting)", retry_after_s=1.0)

    async def start(self, job: GenerateJob, deliver: Callable[[RequestOutput | BaseException], None], span) -> bool:
        """Validate, prefill (remote or local) and add the request to the engine; its outputs (or
        an engine failure) then go to `deliver` on the event loop. False when it was aborted
        before it reached the engine. The caller calls `finished(job)` once it is done with it."""
        job.request_id = job.request_id or uuid.uuid4().hex
        self.validate(job)
        if job.params.structured is not None:
            await self._compile_grammar(*job.params.structured)
        if job.request_id in self._inflight:
            raise InvalidArgument(f"request id {job.request_id!r} is already running on this worker")
        # NOTE: the engine knows this call by its own id, so that an abort or a final output of an
        # earlier call with the same request id (cancelled moments ago) never reaches this one.
        engine_id = f"{job.request_id}#{next(self._starts)}"
        state = self._inflight[job.request_id] = _Inflight(job, list(job.prompt), engine_id)
        try:
            with trace.use_span(span, end_on_exit=False):
                received = await self._remote_prefill(job) if job.prefill_endpoint else None
            if state.aborted:
                return False
            adding = asyncio.ensure_future(self._add(job, engine_id, received, deliver))
            try:
                await asyncio.shield(adding)
            except asyncio.CancelledError:
                # NOTE: the add command is queued on the engine thread and runs anyway; the
                # cancel queued after it takes the request out again (commands run in order).
                self.loop.cancel(engine_id)
                adding.add_done_callback(lambda t: t.cancelled() or t.exception())  # nobody awaits it now
                raise
        except BaseException:
            if self._inflight.get(job.request_id) is state:
                del self._inflight[job.request_id]
            raise
        state.in_engine = True
        if state.aborted:  # NOTE: aborted while it was being added
            self.loop.call_nowait("abort_request", engine_id)
        return True

    def finished(self, job: GenerateJob, out: RequestOutput | None) -> None:
        """The request is over: `out` is its last output (None = given up, aborted in the engine)."""
        state = self._inflight.get(job.request_id)
        if state is None or state.job is not job:  # NOTE: never another call's request of that id
            return
        del self._inflight[job.request_id]
        if out is None:
            if state.in_engine:
                self.loop.cancel(state.engine_id)
        elif self.handback is not None and out.finish_reason not in ("abort", None):
            self.handback.offer(state.tokens)

    def record(self, job: GenerateJob, token_ids: list[int]) -> None:
        """Keeps the request's new tokens for the KV hand-back at its end."""
        if self.handback is not None:
            state = self._inflight.get(job.request_id)
            if state is not None and state.job is job:
                state.tokens.extend(token_ids)

    async def _compile_grammar(self, kind: str, spec: str) -> None:
        """A bad grammar is refused before any prefill; a good one is cached for the engine."""
        try:
            await self.loop.offload("precompile_grammar", kind, spec)
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from exc

    def abort(self, request_id: str) -> bool:
        state = self._inflight.get(request_id)
        if state is None:
            return False
        state.aborted = True
        if state.in_engine:
            self.loop.call_nowait("abort_request", state.engine_id)
        return True

    async def drain(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self._inflight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    async def _add(self, job: GenerateJob, engine_id: str, received: _Received | None, deliver: Callable) -> None:
        kv, start_block = (received.kv, received.start_block) if received is not None else (None, 0)
        try:
            how = await self.loop.start_request(engine_id, deliver, "add_prefilled", engine_id, job.prompt, job.params,
                                                job.detokenize, kv, start_block)
        except ValueError as exc:  # ContextLengthError included
            raise InvalidArgument(str(exc)) from exc
        if how == commands.REMOTE:
            self.counters.remote_prefills += 1
            metrics.REMOTE_PREFILLS.inc()
        else:
            if how == commands.EVICTED:  # NOTE: our cached prefix was evicted meanwhile; prefilled here
                self.counters.prefill_fallbacks += 1
            self.counters.local_prefills += 1
            metrics.LOCAL_PREFILLS.inc()

    async def _remote_prefill(self, job: GenerateJob) -> _Received | None:
        """Ask the prefill worker to push the prompt's KV; None means prefill locally."""
        bs, prompt = self.block_size, job.prompt
        num_tokens = len(prompt) - 1
        cached = await self.loop.call("cached_prefix_blocks", prompt)
        start_block = min(cached, num_tokens // bs)
        if start_block * bs >= num_tokens:
            return None  # everything is in the local prefix cache (or nothing to prefill)
        pending = self.receiver.register(
            PendingKv(job.request_id, num_tokens, start_block, bs, self.hasher.hashes(prompt[:num_tokens]))
        )
        request = prefill_pb2.PrefillRequest(
            request_id=job.request_id, prompt_token_ids=prompt, start_block=start_block,
            encoding=job.kv_encoding or self.kv_encoding,
            destination=common_pb2.WorkerRef(worker_id=self.worker_id, endpoint=self.endpoint),
        )
        try:
            stub = prefill_pb2_grpc.PrefillWorkerStub(self.channels.get(job.prefill_endpoint))
            await stub.Prefill(request, timeout=self.prefill_timeout_s, metadata=inject_metadata())
            if not pending.complete:
                raise Unavailable(pending.error or f"{pending.num_received}/{pending.num_expected} KV blocks arrived")
            return _Received(start_block, pending.kv)
        except (grpc.aio.AioRpcError, MeshError) as exc:
            detail = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
            log.warning("remote prefill of %s on %s failed (%s); prefilling locally", job.request_id, job.prefill_endpoint, detail)
            self.counters.prefill_fallbacks += 1
            return None
        finally:
            self.receiver.unregister(job.request_id)

    async def receive_push(self, frames: AsyncIterator[bytes]) -> tuple[int, int]:
        """Handle one PushKv stream, its messages as bytes (parsed here, a block's on the codec
        pool: `receive.read_push`); returns (blocks, bytes) received."""
        first = await anext(aiter(frames), None)
        first = None if first is None else parse_push(first)
        if first is None or first.WhichOneof("msg") != "open":
            raise InvalidArgument("a KV push must start with KvPushOpen")
        kvwire.check_spec(self.spec, first.open.spec)
        pending = self.receiver.get(first.open.request_id)
        try:
            pending.open(first.open)
            async for frame in frames:
                msg = await self.codec.run(read_push, frame, self.spec, pending)
                kind = msg.WhichOneof("msg")
                if kind == "block":
                    nbytes = kvwire.wire_bytes(msg.block)
                    pending.received(nbytes)
                    label = kvwire.encoding_name(msg.block.header.encoding)
                    metrics.KV_BLOCKS_RECEIVED.labels(label).inc()
                    metrics.KV_BYTES_RECEIVED.labels(label).inc(nbytes)
                elif kind == "close":
                    pending.close(msg.close)
                    break
                else:
                    raise InvalidArgument(f"unexpected {kind!r} frame in a KV push")
            if not pending.closed:
                raise InvalidArgument("KV push ended without KvPushClose")
        except MeshError as exc:
            pending.error = pending.error or str(exc)
            raise
        self.counters.blocks_received += pending.num_received
        self.counters.bytes_received += pending.bytes_received
        return pending.num_received, pending.bytes_received
