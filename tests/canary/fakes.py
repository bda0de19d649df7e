"""Scripted stand-ins for the scheduler and decode workers, for the canary's in-process tests."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import grpc

from kvmesh.runtime.grpcutil import GrpcServer, start_server
from kvmesh.runtime.pb import common_pb2, decode_pb2, decode_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc

Script = Callable[[list[int]], list[int]]


def echo_plus_one(prompt: list[int]) -> list[int]:
    """The 'model' both fake pools share by default: each prompt token + 1."""
    return [t + 1 for t in prompt]


class FakeDecode(decode_pb2_grpc.DecodeWorkerServicer):
    """Streams `script(prompt)` one token per message; waits on `gate` first when one is set."""

    def __init__(self, script: Script = echo_plus_one) -> None:
        self.script = script
        self.gate: asyncio.Event | None = None
        self.requests: list[decode_pb2.GenerateRequest] = []
        self.server: GrpcServer | None = None

    async def Generate(self, request, context):
        self.requests.append(request)
        if self.gate is not None:
            await self.gate.wait()
        for token in self.script(list(request.prompt_token_ids)):
            yield decode_pb2.GenerateResponse(token_ids=[token])
        yield decode_pb2.GenerateResponse(finish_reason="length")


class FakeScheduler(scheduler_pb2_grpc.SchedulerServicer):
    """Routes a pool to its fake decode worker; records Route / Complete / SetProductionPool."""

    def __init__(self, decode_endpoints: dict[str, str]) -> None:
        self.decode_endpoints = decode_endpoints
        self.routes: list[scheduler_pb2.RouteRequest] = []
        self.completes: list[scheduler_pb2.CompleteRequest] = []
        self.production_pool = "production"
        self.set_pool_calls: list[str] = []
        self.splits: list[tuple[str, str, float]] = []  # (pool, canary_pool, canary_weight) per call
        self.refuse_set_pool = False

    async def Route(self, request, context):
        self.routes.append(request)
        endpoint = self.decode_endpoints.get(request.pool)
        if endpoint is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"no decode worker in pool {request.pool!r}")
        ref = common_pb2.WorkerRef(worker_id=f"decode-{request.pool}", endpoint=endpoint)
        return scheduler_pb2.RouteResponse(decode=ref, local_prefill=True, pool=request.pool)

    async def Complete(self, request, context):
        self.completes.append(request)
        return scheduler_pb2.CompleteResponse()

    async def SetProductionPool(self, request, context):
        if self.refuse_set_pool:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"no workers in pool {request.pool!r}")
        self.set_pool_calls.append(request.pool)
        self.splits.append((request.pool, request.canary_pool, request.canary_weight))
        previous, self.production_pool = self.production_pool, request.pool
        return scheduler_pb2.SetProductionPoolResponse(previous_pool=previous)


class FakeMesh:
    """A fake scheduler with a production and a candidate decode worker on 127.0.0.1:0."""

    def __init__(self, candidate_script: Script = echo_plus_one) -> None:
        self.production = FakeDecode()
        self.candidate = FakeDecode(candidate_script)
        self.scheduler: FakeScheduler | None = None
        self._servers: list[GrpcServer] = []

    async def start(self) -> FakeMesh:
        endpoints = {}
        for pool, decode in (("production", self.production), ("candidate", self.candidate)):
            server = await start_server(
                "127.0.0.1", 0, [(decode_pb2_grpc.add_DecodeWorkerServicer_to_server, decode, "kvmesh.v1.DecodeWorker")]
            )
            self._servers.append(server)
            endpoints[pool] = f"127.0.0.1:{server.port}"
        self.scheduler = FakeScheduler(endpoints)
        server = await start_server(
            "127.0.0.1", 0, [(scheduler_pb2_grpc.add_SchedulerServicer_to_server, self.scheduler, "kvmesh.v1.Scheduler")]
        )
        self._servers.append(server)
        self.scheduler_endpoint = f"127.0.0.1:{server.port}"
        return self

    async def stop(self) -> None:
        for gate in (self.production.gate, self.candidate.gate):
            if gate is not None:
                gate.set()
        await asyncio.gather(*(s.stop(0) for s in self._servers))
