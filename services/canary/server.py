"""The gRPC adapter of the Canary service: domain report → CanaryReport, promote, rollback, rollout."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from kvmesh.runtime.bearer import bearer_token, matching_key
from kvmesh.runtime.pb import canary_pb2, canary_pb2_grpc

from .compare import LatencyDelta
from .rollout import RolloutState, StepState
from .rolloutapi import plan_from_pb
from .rolloutdriver import RolloutDriver
from .state import Pools, Report

_ROLLOUT_STATES = {state.value: i + 1 for i, state in enumerate(RolloutState)}
_STEP_STATES = {state.value: i + 1 for i, state in enumerate(StepState)}


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


def rollout_to_pb(status: dict[str, Any]) -> canary_pb2.RolloutStatus:
    """GET /rollout's body (`rolloutstore.rollout_to_json`) as a RolloutStatus."""
    steps = [
        canary_pb2.RolloutStep(
            weight=s["weight"], state=_STEP_STATES[s["state"]], reason=s["reason"], samples=s["samples"],
            served=s["served"], started_at=s["started_at"], finished_at=s["finished_at"],
            checks=[canary_pb2.RolloutCheck(**c) for c in s["checks"]],
        )
        for s in status["steps"]
    ]
    scalars = ("resumed", "latency_comparable", "applied", "min_samples", "min_seconds", "min_served", "judge_latency")
    return canary_pb2.RolloutStatus(
        state=_ROLLOUT_STATES[status["state"]], step=status["step"], weight=status["weight"], reason=status["reason"],
        steps=steps, **{name: status[name] for name in scalars if name in status},
    )


class CanaryServicer(canary_pb2_grpc.CanaryServicer):
    """`admin_key`, when set, is the bearer key the mutating methods need in `authorization` metadata."""

    def __init__(
        self,
        report: Callable[[], Report],
        promote: Callable[[float], Awaitable[Pools]],
        rollback: Callable[[], Awaitable[Pools]],
        rollout: RolloutDriver | None = None,
        admin_key: str = "",
        default_min_samples: int = 20,
    ) -> None:
        self._report = report
        self._promote = promote
        self._rollback = rollback
        self._rollout = rollout
        self._admin_key = admin_key
        self._default_min_samples = default_min_samples

    async def _authorize(self, context: grpc.aio.ServicerContext) -> None:
        if not self._admin_key:
            return
        metadata = dict(context.invocation_metadata() or ())
        if matching_key(bearer_token(metadata.get("authorization")), [self._admin_key]) is None:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "needs metadata 'authorization: Bearer <admin key>'")

    async def _driver(self, context: grpc.aio.ServicerContext) -> RolloutDriver:
        if self._rollout is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "this canary runs no rollouts")
        assert self._rollout is not None
        return self._rollout

    async def StartRollout(self, request: canary_pb2.StartRolloutRequest, context: grpc.aio.ServicerContext) -> canary_pb2.RolloutStatus:
        await self._authorize(context)
        driver = await self._driver(context)
        try:
            plan = plan_from_pb(request, self._default_min_samples)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return rollout_to_pb(await driver.start(plan))

    async def GetRollout(self, request: canary_pb2.GetRolloutRequest, context: grpc.aio.ServicerContext) -> canary_pb2.RolloutStatus:
        return rollout_to_pb((await self._driver(context)).status())

    async def AbortRollout(self, request: canary_pb2.AbortRolloutRequest, context: grpc.aio.ServicerContext) -> canary_pb2.RolloutStatus:
        await self._authorize(context)
        return rollout_to_pb(await (await self._driver(context)).abort())

    async def GetReport(self, request: canary_pb2.GetReportRequest, context: grpc.aio.ServicerContext) -> canary_pb2.CanaryReport:
        return report_to_pb(self._report())

    async def Promote(self, request: canary_pb2.PromoteRequest, context: grpc.aio.ServicerContext) -> canary_pb2.PromoteResponse:
        await self._authorize(context)
        # NOTE: proto3 has no "unset": a weight of 0 means the whole promote.
        pools = await self._promote(request.weight or 1.0)
        return canary_pb2.PromoteResponse(production_pool=pools.production)

    async def Rollback(self, request: canary_pb2.RollbackRequest, context: grpc.aio.ServicerContext) -> canary_pb2.RollbackResponse:
        await self._authorize(context)
        pools = await self._rollback()
        return canary_pb2.RollbackResponse(production_pool=pools.production)
