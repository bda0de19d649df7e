"""Clients of the scheduler and the decode workers, shared by every request."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

import grpc
from opentelemetry import trace

from kvmesh.runtime.blockhash import BlockHasher
from kvmesh.runtime.grpcutil import ChannelPool, TlsConfig
from kvmesh.runtime.pb import decode_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc

from .config import GatewaySettings
from .errors import ApiError
from .failover import EndpointRing, parse_endpoints
from .decodestream import DecodeStreams
from .generation import Generation, GenerationJob

log = logging.getLogger(__name__)

# Route failures after which the gateway asks the next scheduler replica.
FAILOVER = frozenset({
    grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL, grpc.StatusCode.CANCELLED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
})


class Backend:
    """Clients of the scheduler and the decode workers, shared by all requests."""

    def __init__(
        self,
        settings: GatewaySettings,
        hasher: BlockHasher,
        eos_token_ids: frozenset[int] = frozenset(),
        tokenizer: Any = None,
    ) -> None:
        """`tokenizer` (kvmesh.engine.tokenizer.Tokenizer) makes the text of the token stream;
        without it deltas carry token ids only."""
        self.settings = settings
        self.hasher = hasher
        self.eos_token_ids = eos_token_ids
        self.tokenizer = tokenizer
        self.channels = ChannelPool(tls=TlsConfig.from_settings(settings))
        self.schedulers = EndpointRing(parse_endpoints(settings.scheduler))
        self.streams = DecodeStreams(self.decode)

    def scheduler(self, endpoint: str = "") -> scheduler_pb2_grpc.SchedulerStub:
        """The stub of one scheduler replica (the first one when `endpoint` is empty)."""
        return scheduler_pb2_grpc.SchedulerStub(self.channels.get(endpoint or self.schedulers.endpoints[0]))

    async def route(
        self, request: scheduler_pb2.RouteRequest, timeout: float, metadata: Sequence[tuple[str, str]], tried: list[str],
    ) -> scheduler_pb2.RouteResponse:
        """Scheduler.Route on one replica after another until one answers; each endpoint asked is
        appended to `tried` (the last one routed the request, and gets its Complete).

        A replica that is down or failing (UNAVAILABLE, INTERNAL, ...) or full (RESOURCE_EXHAUSTED:
        it admits only its share) hands the request to the next; a deadline or a bad request
        does not. The last replica's error is raised."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        error: grpc.aio.AioRpcError | None = None
        for endpoint in self.schedulers.order():
            left = deadline - loop.time()
            if left <= 0:
                break
            tried.append(endpoint)
            try:
                reply = await self.scheduler(endpoint).Route(request, timeout=left, metadata=metadata)
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in FAILOVER:
                    raise
                if exc.code() is not grpc.StatusCode.RESOURCE_EXHAUSTED:
                    self.schedulers.failed(endpoint)
                    log.warning("scheduler %s failed (%s); trying the next replica", endpoint, exc.code().name)
                error = exc
                continue
            self.schedulers.succeeded(endpoint)
            return reply
        if error is None:
            raise ApiError(504, "The request timed out.", code="timeout")
        raise error

    def decode(self, endpoint: str) -> decode_pb2_grpc.DecodeWorkerStub:
        return decode_pb2_grpc.DecodeWorkerStub(self.channels.get(endpoint))

    def start(self, job: GenerationJob, span: trace.Span | None = None) -> Generation:
        return Generation(self, job, span or trace.INVALID_SPAN)

    async def close(self) -> None:
        await self.streams.close()
        await self.channels.close()
