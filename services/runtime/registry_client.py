"""Blocking helpers for tools (launcher, CLI): gRPC health and the scheduler's worker list."""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from .pb import scheduler_pb2, scheduler_pb2_grpc


def grpc_healthy(endpoint: str, timeout_s: float = 1.0) -> bool:
    with grpc.insecure_channel(endpoint) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=timeout_s)
        except grpc.RpcError:
            return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def list_workers(scheduler: str, timeout_s: float = 1.0) -> list[str]:
    """Worker ids the scheduler currently knows; [] when it cannot be reached."""
    with grpc.insecure_channel(scheduler) as channel:
        try:
            reply = scheduler_pb2_grpc.SchedulerStub(channel).ListWorkers(
                scheduler_pb2.ListWorkersRequest(), timeout=timeout_s
            )
        except grpc.RpcError:
            return []
    return [w.worker_id for w in reply.workers]
