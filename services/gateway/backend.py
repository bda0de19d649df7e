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
from .generation import SIDE_CALL_TIMEOUT_S, Generation, GenerationJob, request_metadata
from .routestream import RouteStreams

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
        self._scheduler_stubs: dict[str, tuple[grpc.aio.Channel, scheduler_pb2_grpc.SchedulerStub]] = {}
        self.streams = DecodeStreams(self.decode)
        self.route_streams = RouteStreams(self.scheduler) if settings.route_stream else None

    def scheduler(self, endpoint: str = "") -> scheduler_pb2_grpc.SchedulerStub:
        """The stub of one scheduler replica (the first one when `endpoint` is empty), built once
        per channel: a stub builds a callable per method (~20 of them), which was a third of what the
        gateway's periodic worker-list read cost."""
        endpoint = endpoint or self.schedulers.endpoints[0]
        channel = self.channels.get(endpoint)
        cached = self._scheduler_stubs.get(endpoint)
        if cached is None or cached[0] is not channel:  # NOTE: a discarded channel's endpoint gets a new one
            cached = self._scheduler_stubs[endpoint] = (channel, scheduler_pb2_grpc.SchedulerStub(channel))
        return cached[1]

    async def route(
        self, request: scheduler_pb2.RouteRequest, timeout: float, metadata: Sequence[tuple[str, str]], tried: list[str],
    ) -> scheduler_pb2.RouteResponse:
        """Route on one replica after another until one answers; each endpoint asked is appended
        to `tried` (the last one routed the request, and gets its Complete). Each replica is asked
        on its Routes stream (routestream.py), or with a unary Route when the stream is off or
        the replica lacks it; `metadata` (trace context, request id) goes with unary calls.

        A replica that is down or failing (UNAVAILABLE, INTERNAL, a broken stream, ...) or full
        (RESOURCE_EXHAUSTED: it admits only its share) hands the request to the next; a deadline
        or a bad request does not. The last replica's error is raised."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        error: grpc.aio.AioRpcError | None = None
        for endpoint in self.schedulers.order():
            left = deadline - loop.time()
            if left <= 0:
                break
            tried.append(endpoint)
            try:
                reply = await self._route_on(endpoint, request, left, metadata)
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

    async def _route_on(
        self, endpoint: str, request: scheduler_pb2.RouteRequest, timeout: float, metadata: Sequence[tuple[str, str]],
    ) -> scheduler_pb2.RouteResponse:
        streams = self.route_streams
        if streams is not None and streams.supported(endpoint):
            try:
                trace_context = {k: v for k, v in metadata if k != "x-request-id"}  # on the stream: per request
                return await streams.get(endpoint).route(request, trace_context, timeout)
            except grpc.aio.AioRpcError as exc:
                if exc.code() is not grpc.StatusCode.UNIMPLEMENTED:
                    raise
                streams.unsupported(endpoint)  # NOTE: nothing ran there: ask the same replica unary
        return await self.scheduler(endpoint).Route(request, timeout=timeout, metadata=metadata)

    async def complete(self, endpoint: str, request_id: str, status: str) -> None:
        """Complete on the replica that routed the request: on its Routes stream when one is open
        (not answered), else unary, best effort. Call it inside the request's span."""
        endpoint = endpoint or self.schedulers.endpoints[0]
        request = scheduler_pb2.CompleteRequest(request_id=request_id, status=status)
        stream = self.route_streams.open(endpoint) if self.route_streams is not None else None
        if stream is not None and stream.complete(request):
            return
        try:
            await self.scheduler(endpoint).Complete(
                request, timeout=SIDE_CALL_TIMEOUT_S, metadata=request_metadata(request_id)
            )
        except grpc.aio.AioRpcError as exc:
            log.warning("Complete(%s) failed: %s", request_id, exc.code().name)

    def decode(self, endpoint: str) -> decode_pb2_grpc.DecodeWorkerStub:
        return decode_pb2_grpc.DecodeWorkerStub(self.channels.get(endpoint))

    def start(self, job: GenerationJob, span: trace.Span | None = None) -> Generation:
        return Generation(self, job, span or trace.INVALID_SPAN)

    async def close(self) -> None:
        if self.route_streams is not None:
            await self.route_streams.close()
        await self.streams.close()
        await self.channels.close()
