"""The gRPC adapter of the Canary service: domain report → CanaryReport, promote, rollback."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import grpc

from kvmesh.runtime.pb import canary_pb2, canary_pb2_grpc

from .compare import LatencyDelta
from .state import Pools, Report


def latency_to_pb(delta: LatencyDelta) -> canary_pb2.LatencyDelta:
    return canary_pb2.LatencyDelta(
        production_p50_s=delta.production.p50,
        production_p99_s=delta.production.p99,
        candidate_p50_s=delta.candidate.p50,
        candidate_p99_s=delta.candidate.p99,
    )


def report_to_pb(report: Report) -> canary_pb2.CanaryReport:
    s = report.summary
    return canary_pb2.CanaryReport(
        verdict=int(report.decision.verdict),
        reason=report.decision.reason,
        samples=s.samples,
        exact_match_rate=s.exact_match_rate,
        token_agreement=s.token_agreement,
        noise_floor_agreement=s.noise_floor_agreement,
        mean_first_divergence=s.mean_first_divergence,
        ttft=latency_to_pb(s.ttft),
        tpot=latency_to_pb(s.tpot),
        production_error_rate=s.production_error_rate,
        candidate_error_rate=s.candidate_error_rate,
        mirror_received=report.received,
        mirror_dropped=report.dropped,
        mirror_malformed=report.malformed,
        promoted_weight=report.promoted_weight,
        mirror_candidate_served=report.candidate_served,
        warmup_left=report.warmup_left,
        production_pool=report.pools.production,
        candidate_pool=report.pools.candidate,
        noise_samples=s.noise_samples,
        mirror_duplicates=report.duplicates,
        buffered=report.buffered,
    )


class CanaryServicer(canary_pb2_grpc.CanaryServicer):
    def __init__(
        self,
        report: Callable[[], Report],
        promote: Callable[[float], Awaitable[Pools]],
        rollback: Callable[[], Awaitable[Pools]],
    ) -> None:
        self._report = report
        self._promote = promote
        self._rollback = rollback

    async def GetReport(self, request: canary_pb2.GetReportRequest, context: grpc.aio.ServicerContext) -> canary_pb2.CanaryReport:
        return report_to_pb(self._report())

    async def Promote(self, request: canary_pb2.PromoteRequest, context: grpc.aio.ServicerContext) -> canary_pb2.PromoteResponse:
        # NOTE: proto3 has no "unset": a weight of 0 means the whole promote.
        pools = await self._promote(request.weight or 1.0)
        return canary_pb2.PromoteResponse(production_pool=pools.production)

    async def Rollback(self, request: canary_pb2.RollbackRequest, context: grpc.aio.ServicerContext) -> canary_pb2.RollbackResponse:
        pools = await self._rollback()
        return canary_pb2.RollbackResponse(production_pool=pools.production)
