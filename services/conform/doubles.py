"""Test doubles the suites start for the roles around the one under test, written from the
protos and docs/contracts.md alone. Each records what it was asked; behaviour is scripted."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from kvmesh.runtime.pb import (
    common_pb2, decode_pb2, decode_pb2_grpc, kvstore_pb2, kvstore_pb2_grpc, prefill_pb2, prefill_pb2_grpc,
    scheduler_pb2, scheduler_pb2_grpc,
)

from .probe import CHANNEL_OPTIONS, channel


@dataclass(slots=True)
class Served:
    server: grpc.aio.Server
    port: int
    health: health.aio.HealthServicer

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def stop(self) -> None:
        await self.server.stop(0.5)


async def serve(port: int, *adders: Callable[[grpc.aio.Server], None]) -> Served:
    """A gRPC server on 127.0.0.1:`port` (0 = any) with the standard health service."""
    server = grpc.aio.server(options=[*CHANNEL_OPTIONS, ("grpc.so_reuseport", 0)])
    for add in adders:
        add(server)
    status = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(status, server)
    await status.set("", health_pb2.HealthCheckResponse.SERVING)
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    if port and bound != port:
        raise OSError(f"port {port} is taken")
    await server.start()
    return Served(server, bound, status)


@dataclass(slots=True)
class Call:
    """One recorded call: the request, whether it carried a deadline, and how it ended."""

    request: Any
    deadline_s: float | None
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    via_stream: bool = False    # a `generate` on the multiplexed Stream (which has no deadline of its own)


# -- scheduler -------------------------------------------------------------------------------
RouteScript = Callable[[scheduler_pb2.RouteRequest, grpc.aio.ServicerContext], Awaitable[scheduler_pb2.RouteResponse]]


class FakeScheduler(scheduler_pb2_grpc.SchedulerServicer):
    """Routes every request to `decode` (a WorkerRef) unless `script` says otherwise."""

    def __init__(self) -> None:
        self.routes: list[Call] = []
        self.completes: list[scheduler_pb2.CompleteRequest] = []
        self.pool_changes: list[scheduler_pb2.SetProductionPoolRequest] = []
        self.decode = common_pb2.WorkerRef()
        self.production_pool = "production"
        self.script: RouteScript | None = None

    async def Routes(self, request_iterator, context):  # noqa: ANN001, ANN201, N802
        """Unary-only, like a scheduler without the Routes stream. NOTE: the generated base's
        NotImplementedError reached a plain grpc server's client as UNIMPLEMENTED or, at times,
        UNKNOWN; a gateway must only ever see UNIMPLEMENTED here (then it routes unary)."""
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "this scheduler has no Routes stream")
        yield  # pragma: no cover - makes this a stream handler

    async def Route(self, request, context):  # noqa: ANN001, N802
        self.routes.append(Call(request, context.time_remaining()))
        if self.script is not None:
            return await self.script(request, context)
        return scheduler_pb2.RouteResponse(decode=self.decode, local_prefill=True, policy="conform",
                                           pool=request.pool or self.production_pool)

    async def Complete(self, request, context):  # noqa: ANN001, N802
        self.completes.append(request)
        return scheduler_pb2.CompleteResponse()

    async def ListWorkers(self, request, context):  # noqa: ANN001, N802
        # The decode worker it routes to is listed as live in production: a gateway is ready (G1).
        workers = [scheduler_pb2.WorkerStatus(worker_id=self.decode.worker_id or "conform-decode",
                                              role=common_pb2.WORKER_ROLE_DECODE, endpoint=self.decode.endpoint,
                                              pool=self.production_pool)]
        return scheduler_pb2.ListWorkersResponse(production_pool=self.production_pool, workers=workers)

    async def SetProductionPool(self, request, context):  # noqa: ANN001, N802
        self.pool_changes.append(request)
        previous, self.production_pool = self.production_pool, request.pool or self.production_pool
        return scheduler_pb2.SetProductionPoolResponse(previous_pool=previous)


# -- decode ----------------------------------------------------------------------------------
GenerateScript = Callable[[decode_pb2.GenerateRequest, grpc.aio.ServicerContext, Call], Any]


def echo_replies(token_ids: list[int], text: str, prompt_tokens: int, per_message: int = 2) -> list[decode_pb2.GenerateResponse]:
    """A well-formed Generate stream: `token_ids` in messages of `per_message`, the text split
    likewise, the last message with finish_reason "length" and usage."""
    chunks = [token_ids[i : i + per_message] for i in range(0, len(token_ids), per_message)] or [[]]
    step = -(-len(text) // len(chunks)) if text else 0
    replies = [decode_pb2.GenerateResponse(token_ids=c, text=text[i * step : (i + 1) * step]) for i, c in enumerate(chunks)]
    replies[-1].finish_reason = "length"
    replies[-1].usage.CopyFrom(common_pb2.Usage(prompt_tokens=prompt_tokens, completion_tokens=len(token_ids)))
    return replies


class FakeDecode(decode_pb2_grpc.DecodeWorkerServicer):
    """Answers Generate with `script(request, context, call)` (an async iterator of replies); on
    the multiplexed Stream (docs/token-stream.md) each `generate` runs the same script, its
    replies turned into RequestDeltas (token ids, finish, usage: no text)."""

    def __init__(self, name: str, script: GenerateScript) -> None:
        self.name = name
        self.script = script
        self.generates: list[Call] = []
        self.aborts: list[str] = []

    async def Stream(self, request_iterator, context):  # noqa: ANN001, N802
        out: asyncio.Queue = asyncio.Queue()
        tasks: dict[str, asyncio.Task] = {}

        async def run(request: decode_pb2.GenerateRequest, call: Call) -> None:
            try:
                async for reply in self.script(request, context, call):
                    out.put_nowait(delta_of(request.request_id, reply))
            except asyncio.CancelledError:
                call.cancelled.set()
                out.put_nowait(decode_pb2.RequestDelta(request_id=request.request_id, finish_reason="abort",
                                                       usage=common_pb2.Usage()))
            except grpc.aio.AbortError:
                out.put_nowait(grpc.aio.AbortError)

        async def read() -> None:
            async for msg in request_iterator:
                if msg.WhichOneof("msg") == "generate":
                    call = Call(msg.generate, None, via_stream=True)
                    self.generates.append(call)
                    tasks[msg.generate.request_id] = asyncio.create_task(run(msg.generate, call))
                elif msg.WhichOneof("msg") == "abort":
                    self.aborts.append(msg.abort.request_id)
                    task = tasks.get(msg.abort.request_id)
                    if task is not None:
                        task.cancel()

        reader = asyncio.create_task(read())
        try:
            while True:
                delta = await out.get()
                if delta is grpc.aio.AbortError:   # a script's scripted failure fails the whole stream
                    await context.abort(grpc.StatusCode.UNAVAILABLE, "conform: scripted worker failure")
                yield decode_pb2.StepOutput(deltas=[delta])
        finally:
            reader.cancel()
            for task in tasks.values():
                task.cancel()

    async def Generate(self, request, context):  # noqa: ANN001, N802
        call = Call(request, context.time_remaining())
        self.generates.append(call)
        try:
            async for reply in self.script(request, context, call):
                yield reply
        except asyncio.CancelledError:
            call.cancelled.set()
            raise
        except grpc.aio.AbortError:   # a script's scripted failure
            await context.abort(grpc.StatusCode.UNAVAILABLE, "conform: scripted worker failure")

    async def Abort(self, request, context):  # noqa: ANN001, N802
        self.aborts.append(request.request_id)
        return decode_pb2.AbortResponse(found=False)

    async def PushKv(self, request_iterator, context):  # noqa: ANN001, N802
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "this double takes no KV")


def delta_of(request_id: str, reply: decode_pb2.GenerateResponse) -> decode_pb2.RequestDelta:
    delta = decode_pb2.RequestDelta(request_id=request_id, token_ids=reply.token_ids, finish_reason=reply.finish_reason)
    if reply.HasField("usage"):
        delta.usage.CopyFrom(reply.usage)
    return delta


class KvSink(decode_pb2_grpc.DecodeWorkerServicer):
    """A decode double that only receives KV pushes and keeps every frame (prefill suite)."""

    def __init__(self) -> None:
        self.pushes: list[list[decode_pb2.KvPushMessage]] = []
        self.refuse: str = ""        # non-empty: abort every push with INVALID_ARGUMENT
        self.stall_s: float = 0.0    # sleep before answering (deadline clauses)

    async def PushKv(self, request_iterator, context):  # noqa: ANN001, N802
        frames = [msg async for msg in request_iterator]
        self.pushes.append(frames)
        if self.refuse:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, self.refuse)
        if self.stall_s:
            await asyncio.sleep(self.stall_s)
        blocks = [f.block for f in frames if f.WhichOneof("msg") == "block"]
        return decode_pb2.PushKvResponse(blocks_received=len(blocks),
                                         bytes_received=sum(len(b.data) + len(b.scales) for b in blocks))


# -- prefill ---------------------------------------------------------------------------------
class FailingPrefill(prefill_pb2_grpc.PrefillWorkerServicer):
    """A prefill double that pushes one frame with a foreign model spec to the destination (which
    must refuse it), then fails the Prefill call with UNAVAILABLE (decode suite)."""

    FOREIGN = common_pb2.ModelSpec(model_id="conform-foreign-model", dtype="float32", block_size=16,
                                   num_layers=1, num_kv_heads=1, head_dim=1)

    def __init__(self) -> None:
        self.requests: list[prefill_pb2.PrefillRequest] = []
        self.push_errors: list[grpc.StatusCode | None] = []

    async def Prefill(self, request, context):  # noqa: ANN001, N802
        self.requests.append(request)
        open_ = decode_pb2.KvPushOpen(request_id=request.request_id, spec=self.FOREIGN,
                                      num_tokens=len(request.prompt_token_ids) - 1, start_block=request.start_block)
        async with channel(request.destination.endpoint) as chan:
            stub = decode_pb2_grpc.DecodeWorkerStub(chan)
            try:
                await stub.PushKv(iter([decode_pb2.KvPushMessage(open=open_),
                                        decode_pb2.KvPushMessage(close=decode_pb2.KvPushClose(num_blocks=0))]),
                                  timeout=5.0)
                self.push_errors.append(None)
            except grpc.aio.AioRpcError as exc:
                self.push_errors.append(exc.code())
        await context.abort(grpc.StatusCode.UNAVAILABLE, "conform: this prefill double always fails")


# -- kvstore ---------------------------------------------------------------------------------
class RecordingStore(kvstore_pb2_grpc.KvStoreServicer):
    """A kvstore double that holds nothing and records every Put stream (decode hand-back)."""

    def __init__(self) -> None:
        self.puts: list[list[kvstore_pb2.PutMessage]] = []
        self.put_seen = asyncio.Event()
        self.lookups: list[str] = []  # "Lookup" or "LookupChains", a call each

    async def Lookup(self, request, context):  # noqa: ANN001, N802
        self.lookups.append("Lookup")
        return kvstore_pb2.LookupResponse(num_blocks=0)

    async def LookupChains(self, request, context):  # noqa: ANN001, N802
        self.lookups.append("LookupChains")
        return kvstore_pb2.LookupChainsResponse(chains=[kvstore_pb2.LookupResponse() for _ in request.chains])

    async def Get(self, request, context):  # noqa: ANN001, N802
        await context.abort(grpc.StatusCode.NOT_FOUND, "this double holds no blocks")
        yield common_pb2.KvBlock()  # pragma: no cover - makes this an async generator

    async def Put(self, request_iterator, context):  # noqa: ANN001, N802
        frames = [msg async for msg in request_iterator]
        self.puts.append(frames)
        self.put_seen.set()
        counts = {"block": lambda f: 1, "blocks": lambda f: len(f.blocks.blocks), "runs": lambda f: sum(len(r.block_hashes) for r in f.runs.runs)}
        blocks = sum(counts[f.WhichOneof("msg")](f) for f in frames if f.WhichOneof("msg") in counts)
        return kvstore_pb2.PutResponse(stored=blocks)

    async def Stats(self, request, context):  # noqa: ANN001, N802
        return kvstore_pb2.StatsResponse()


def add(servicer: Any) -> Callable[[grpc.aio.Server], None]:
    """The `add_*Servicer_to_server` of a double, by its base class."""
    for module, name in ((scheduler_pb2_grpc, "Scheduler"), (decode_pb2_grpc, "DecodeWorker"),
                         (prefill_pb2_grpc, "PrefillWorker"), (kvstore_pb2_grpc, "KvStore")):
        if isinstance(servicer, getattr(module, f"{name}Servicer")):
            return lambda server: getattr(module, f"add_{name}Servicer_to_server")(servicer, server)
    raise TypeError(f"not a kvmesh servicer: {servicer!r}")
