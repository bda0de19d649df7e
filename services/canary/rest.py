"""The REST face of the canary: GET /report, POST /promote, POST /rollback, POST/GET/DELETE /rollout,
GET /metrics, GET /health."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from kvmesh.runtime.bearer import bearer_token, matching_key
from kvmesh.runtime.errors import MeshError, status_for

from .compare import LatencyDelta
from .rolloutapi import plan_from_json
from .rolloutdriver import RolloutDriver
from .state import Pools, Report, check_weight

_HTTP_STATUS = {"INVALID_ARGUMENT": 400, "FAILED_PRECONDITION": 409, "UNAVAILABLE": 503, "DEADLINE_EXCEEDED": 504}


def _latency_json(delta: LatencyDelta) -> dict[str, float]:
    return {
        "production_p50_s": delta.production.p50,
        "production_p99_s": delta.production.p99,
        "candidate_p50_s": delta.candidate.p50,
        "candidate_p99_s": delta.candidate.p99,
        "delta_p50_s": delta.delta_p50,
        "delta_p99_s": delta.delta_p99,
    }


def report_to_json(report: Report) -> dict[str, Any]:
    """Field names follow kvmesh.v1.CanaryReport; `verdict` is "collecting" | "pass" | "fail"."""
    s = report.summary
    return {
        "verdict": report.decision.verdict.name.lower(),
        "reason": report.decision.reason,
        "samples": s.samples,
        "exact_match_rate": s.exact_match_rate,
        "token_agreement": s.token_agreement,
        "noise_floor_agreement": s.noise_floor_agreement,
        "noise_samples": s.noise_samples,
        "mean_first_divergence": s.mean_first_divergence,
        "ttft": _latency_json(s.ttft),
        "tpot": _latency_json(s.tpot),
        "production_error_rate": s.production_error_rate,
        "candidate_error_rate": s.candidate_error_rate,
        "mirror_received": report.received,
        "mirror_dropped": report.dropped,
        "mirror_duplicates": report.duplicates,
        "mirror_malformed": report.malformed,
        "buffered": report.buffered,
        "promoted_weight": report.promoted_weight,
        "mirror_candidate_served": report.candidate_served,
        "warmup_left": report.warmup_left,
        "production_pool": report.pools.production,
        "candidate_pool": report.pools.candidate,
    }


def promote_weight(body: bytes) -> float:
    """POST /promote's body: empty (the whole promote) or {"weight": w} with w in (0, 1]."""
    if not body.strip():
        return 1.0
    try:
        parsed = json.loads(body)
    except ValueError:
        raise ValueError("the body must be JSON like {\"weight\": 0.25}") from None
    if not isinstance(parsed, dict) or set(parsed) - {"weight"}:
        raise ValueError("the body may only hold \"weight\", e.g. {\"weight\": 0.25}")
    weight = parsed.get("weight", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, (int, float)):
        raise ValueError(f"weight must be a number, got {weight!r}")
    check_weight(float(weight))
    return float(weight)


def build_app(
    report: Callable[[], Report],
    promote: Callable[[float], Awaitable[Pools]],
    rollback: Callable[[], Awaitable[Pools]],
    registry: CollectorRegistry,
    healthy: Callable[[], dict[str, Any]],
    admin_key: str = "",
    rollout: RolloutDriver | None = None,
    default_min_samples: int = 20,
) -> FastAPI:
    """`admin_key`, when set, is the bearer key POST /promote, /rollback, /rollout and DELETE
    /rollout require."""
    app = FastAPI(title="kvmesh canary", docs_url=None, redoc_url=None)

    def refused(request: Request) -> JSONResponse | None:
        if not admin_key:
            return None
        if matching_key(bearer_token(request.headers.get("authorization")), [admin_key]) is not None:
            return None
        return JSONResponse({"error": "promote, rollback and rollout need 'Authorization: Bearer <admin key>'"},
                            status_code=401)

    async def switch(action: Callable[[], Awaitable[Any]]) -> JSONResponse:
        try:
            pools = await action()
        except MeshError as exc:
            status = _HTTP_STATUS.get(status_for(exc).name, 500)
            return JSONResponse({"error": str(exc)}, status_code=status)
        if isinstance(pools, dict):
            return JSONResponse(pools)
        return JSONResponse({
            "production_pool": pools.production,
            "candidate_pool": pools.candidate,
            "promoted_weight": report().promoted_weight,
        })

    @app.get("/report")
    async def get_report() -> dict[str, Any]:
        return report_to_json(report())

    @app.post("/promote")
    async def post_promote(request: Request) -> JSONResponse:
        if (denied := refused(request)) is not None:
            return denied
        try:
            weight = promote_weight(await request.body())
        except ValueError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        return await switch(lambda: promote(weight))

    @app.post("/rollback")
    async def post_rollback(request: Request) -> JSONResponse:
        if (denied := refused(request)) is not None:
            return denied
        return await switch(rollback)

    if rollout is not None:

        @app.post("/rollout")
        async def post_rollout(request: Request) -> JSONResponse:
            if (denied := refused(request)) is not None:
                return denied
            try:
                plan = plan_from_json(await request.body(), default_min_samples)
            except ValueError as exc:
                return JSONResponse({"error": str(exc)}, status_code=400)
            return await switch(lambda: rollout.start(plan))

        @app.get("/rollout")
        async def get_rollout() -> dict[str, Any]:
            return rollout.status()

        @app.delete("/rollout")
        async def delete_rollout(request: Request) -> JSONResponse:
            if (denied := refused(request)) is not None:
                return denied
            return await switch(rollout.abort)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/health")
    async def health() -> JSONResponse:
        body = healthy()
        return JSONResponse(body, status_code=200 if body.get("status") == "ok" else 503)

    return app
