"""Scripted in-process stand-ins for the scheduler and decode workers (real gRPC on 127.0.0.1:0).

The fake decode worker serves the token stream (`DecodeWorker.Stream`) and "generates" letters: the token after `ids` is `97 + len(ids) % 26`, a
function of the sequence length only, so a request moved to another worker mid-stream continues
exactly where the first left off.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import grpc

from kvmesh.runtime.grpcutil import GrpcServer, start_server
from kvmesh.runtime.pb import common_pb2, decode_pb2, decode_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc


def next_token(ids: list[int]) -> int:
    return 97 + len(ids) % 26


def expected_text(num_prompt_tokens: int, n: int) -> str:
    ids = list(range(num_prompt_tokens))
    out = []
    for _ in range(n):
        tok = next_token(ids)
        ids.append(tok)
        out.append(chr(tok))
    return "".join(out)


@dataclass
class RouteError:
    code: grpc.StatusCode
    message: str
    retry_after: str | None = None


class FakeScheduler(scheduler_pb2_grpc.SchedulerServicer):
    def __init__(self) -> None:
        self.workers: list[common_pb2.WorkerRef] = []
        self.routes: list[scheduler_pb2.RouteRequest] = []
        self.completes: list[scheduler_pb2.CompleteRequest] = []
        self.metadata: list[dict[str, str]] = []
        self.error: RouteError | None = None
        self.gate: asyncio.Event | None = None  # when set, Route waits for it
        self.completed = asyncio.Event()

    async def Route(self, request, context):
        self.routes.append(request)
        self.metadata.append({k: v for k, v in context.invocation_metadata()})
        if self.gate is not None:
            await self.gate.wait()
        if self.error is not None:
            if self.error.retry_after is not None:
                context.set_trailing_metadata((("retry-after", self.error.retry_after),))
            await context.abort(self.error.code, self.error.message)
        candidates = [w for w in self.workers if w.worker_id not in request.exclude_workers]
        if not candidates:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "no decode worker available")
        return scheduler_pb2.RouteResponse(decode=candidates[0], local_prefill=True, policy="fake", pool="production")

    async def Complete(self, request, context):
        self.completes.append(request)
        self.completed.set()
        return scheduler_pb2.CompleteResponse()

    def statuses(self) -> list[str]:
        return [c.status for c in self.completes]


class FakeDecode(decode_pb2_grpc.DecodeWorkerServicer):
    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id
        self.requests: list[decode_pb2.GenerateRequest] = []
        self.aborts: list[str] = []
        self.cancelled: list[str] = []
        self.fail_after: int | None = None  # tokens sent before failing
        self.fail_code = grpc.StatusCode.UNAVAILABLE
        self.die_after: int | None = None  # tokens sent before the whole server stops
        self.delay_s = 0.0
        self.next_token = next_token  # the token after `ids` (a function of the sequence only)
        self.drop_finish = False  # die right after the last token, before its finish message
        self.cached_tokens = 0
        self.error: tuple[grpc.StatusCode, str] | None = None
        self.server: GrpcServer | None = None
        self.aborted = asyncio.Event()

    async def Stream(self, request_iterator, context):
        """The token stream: each request runs as its own task; their deltas leave as they come."""
        outbox: asyncio.Queue = asyncio.Queue()
        tasks: dict[str, asyncio.Task] = {}

        async def read() -> None:
            async for msg in request_iterator:
                if msg.WhichOneof("msg") == "generate":
                    rid = msg.generate.request_id
                    tasks[rid] = asyncio.create_task(self._run(msg.generate, outbox))
                else:
                    rid = msg.abort.request_id
                    self.aborts.append(rid)
                    self.aborted.set()
                    if rid in tasks and not tasks[rid].done():
                        tasks[rid].cancel()
                        outbox.put_nowait(decode_pb2.RequestDelta(request_id=rid, finish_reason="abort"))

        reader = asyncio.create_task(read())
        try:
            while True:
                delta = await outbox.get()
                if delta is None:
                    await asyncio.sleep(30)  # the server is stopping under us
                yield decode_pb2.StepOutput(deltas=[delta])
        finally:
            reader.cancel()
            for task in tasks.values():
                task.cancel()

    async def _run(self, request, outbox: asyncio.Queue) -> None:
        rid = request.request_id
        self.requests.append(request)
        if self.error is not None:
            outbox.put_nowait(decode_pb2.RequestDelta(request_id=rid, error_code=self.error[0].value[0], error_message=self.error[1]))
            return
        ids = list(request.prompt_token_ids)
        n = request.sampling.max_tokens
        try:
            for i in range(n):
                if self.fail_after is not None and i >= self.fail_after:
                    outbox.put_nowait(decode_pb2.RequestDelta(
                        request_id=rid, error_code=self.fail_code.value[0], error_message="decode worker failing on purpose"))
                    return
                if self.die_after is not None and i >= self.die_after:
                    asyncio.get_running_loop().create_task(self.server.stop(0))
                    outbox.put_nowait(None)
                    return
                tok = self.next_token(ids)
                ids.append(tok)
                msg = decode_pb2.RequestDelta(request_id=rid, token_ids=[tok], cached_tokens=self.cached_tokens)
                if request.sampling.HasField("logprobs"):
                    top = [common_pb2.TopLogprob(token_id=tok, logprob=-0.5), common_pb2.TopLogprob(token_id=tok + 1, logprob=-1.5)]
                    msg.logprobs.append(common_pb2.TokenLogprob(token_id=tok, logprob=-0.5, top=top[: request.sampling.logprobs]))
                if i == n - 1 and self.drop_finish:
                    outbox.put_nowait(msg)
                    outbox.put_nowait(decode_pb2.RequestDelta(
                        request_id=rid, error_code=grpc.StatusCode.UNAVAILABLE.value[0], error_message="died before finishing"))
                    return
                if i == n - 1:
                    msg.finish_reason = "length"
                    msg.usage.CopyFrom(
                        common_pb2.Usage(
                            prompt_tokens=len(request.prompt_token_ids), completion_tokens=n, cached_tokens=self.cached_tokens
                        )
                    )
                outbox.put_nowait(msg)
                await asyncio.sleep(self.delay_s)
        except asyncio.CancelledError:
            self.cancelled.append(rid)
            raise

    async def Abort(self, request, context):
        self.aborts.append(request.request_id)
        self.aborted.set()
        return decode_pb2.AbortResponse(found=True)


@dataclass
class FakeMesh:
    scheduler: FakeScheduler
    scheduler_server: GrpcServer
    decodes: list[FakeDecode] = field(default_factory=list)

    @property
    def scheduler_endpoint(self) -> str:
        return f"127.0.0.1:{self.scheduler_server.port}"

    async def add_decode(self, worker_id: str) -> FakeDecode:
        decode = FakeDecode(worker_id)
        decode.server = await start_server(
            "127.0.0.1", 0, [(decode_pb2_grpc.add_DecodeWorkerServicer_to_server, decode, "kvmesh.v1.DecodeWorker")]
        )
        self.scheduler.workers.append(common_pb2.WorkerRef(worker_id=worker_id, endpoint=f"127.0.0.1:{decode.server.port}"))
        self.decodes.append(decode)
        return decode

    async def stop(self) -> None:
        for d in self.decodes:
            await d.server.stop(0)
        await self.scheduler_server.stop(0)


async def start_fake_mesh(num_decode: int = 1) -> FakeMesh:
    scheduler = FakeScheduler()
    server = await start_server(
        "127.0.0.1", 0, [(scheduler_pb2_grpc.add_SchedulerServicer_to_server, scheduler, "kvmesh.v1.Scheduler")]
    )
    mesh = FakeMesh(scheduler, server)
    for i in range(num_decode):
        await mesh.add_decode(f"decode-{i}")
    return mesh
