"""Clients of the scheduler and the decode workers, shared by every request."""

from __future__ import annotations

from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry import trace

from kvmesh.runtime.blockhash import BlockHasher
from kvmesh.runtime.grpcutil import ChannelPool, TlsConfig
from kvmesh.runtime.pb import decode_pb2_grpc, scheduler_pb2_grpc

from .config import GatewaySettings
from .decodestream import DecodeStreams
from .generation import SIDE_CALL_TIMEOUT_S, Generation, GenerationJob


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
        self.streams = DecodeStreams(self.decode)

    def scheduler(self) -> scheduler_pb2_grpc.SchedulerStub:
        return scheduler_pb2_grpc.SchedulerStub(self.channels.get(self.settings.scheduler))

    def decode(self, endpoint: str) -> decode_pb2_grpc.DecodeWorkerStub:
        return decode_pb2_grpc.DecodeWorkerStub(self.channels.get(endpoint))

    async def healthy(self) -> bool:
        """True when the scheduler answers its health check with SERVING."""
        stub = health_pb2_grpc.HealthStub(self.channels.get(self.settings.scheduler))
        try:
            reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=SIDE_CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError:
            return False
        return reply.status == health_pb2.HealthCheckResponse.SERVING

    def start(self, job: GenerationJob, span: trace.Span | None = None) -> Generation:
        return Generation(self, job, span or trace.INVALID_SPAN)

    async def close(self) -> None:
        await self.streams.close()
        await self.channels.close()
