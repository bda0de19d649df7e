"""Blocking helpers for tools (launcher, CLI): gRPC health and the scheduler's worker list.

They use the mesh's TLS settings (KVMESH_TLS_*) when those are configured.
"""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from .config import MeshSettings
from .grpcutil import TlsConfig
from .pb import scheduler_pb2, scheduler_pb2_grpc


def _channel(endpoint: str, tls: TlsConfig | None) -> grpc.Channel:
    if tls is None:
        return grpc.insecure_channel(endpoint)
    return grpc.secure_channel(endpoint, tls.channel_credentials())


def mesh_tls() -> TlsConfig | None:
    """The TLS configuration the environment gives this mesh (None = plaintext)."""
    return TlsConfig.from_settings(MeshSettings())


def grpc_healthy(endpoint: str, timeout_s: float = 1.0, tls: TlsConfig | None = None) -> bool:
    with _channel(endpoint, tls) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=timeout_s)
        except grpc.RpcError:
            return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def list_workers(scheduler: str, timeout_s: float = 1.0, tls: TlsConfig | None = None) -> list[str]:
    """Worker ids the scheduler currently knows; [] when it cannot be reached."""
    return [w.worker_id for w in _workers(scheduler, timeout_s, tls)]


def worker_endpoints(scheduler: str, timeout_s: float = 1.0, tls: TlsConfig | None = None) -> list[str]:
    """Endpoints of the workers the scheduler currently knows; [] when it cannot be reached."""
    return [w.endpoint for w in _workers(scheduler, timeout_s, tls)]


def _workers(scheduler: str, timeout_s: float, tls: TlsConfig | None) -> list[scheduler_pb2.WorkerStatus]:
    with _channel(scheduler, tls) as channel:
        try:
            reply = scheduler_pb2_grpc.SchedulerStub(channel).ListWorkers(
                scheduler_pb2.ListWorkersRequest(), timeout=timeout_s
            )
        except grpc.RpcError:
            return []
    return list(reply.workers)
