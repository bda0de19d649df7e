"""The HTTP adapter: FastAPI routes, auth, OpenAI-shaped errors, request metrics."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from importlib.metadata import PackageNotFoundError, version as package_version
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kvmesh.runtime.looplag import LoopLag
from kvmesh.runtime.process import freeze_startup_objects

from . import openapi
from .auth import ApiKeys
from .backend import Backend
from .config import GatewaySettings
from .contextlen import ContextLengthWatch
from .errors import ApiError, model_not_found
from .fastpath import CompletionRoutes
from .handlers import CompletionService, read_body
from .metrics import GatewayMetrics
from .mirror import MirrorTap
from .prompt import ServedModel
from .protocol import ChatBody, CompletionBody, Endpoint, MirrorUpdate
from .readiness import decode_workers_ready
from .tokenize import DetokenizeBody, TokenizeBody, detokenize, tokenize
from .validate import parse_json, validate_body
from .workerlist import WorkerList

log = logging.getLogger(__name__)


def error_response(error: ApiError, request_id: str | None = None) -> JSONResponse:
    headers = error.headers()
    if request_id:
        headers["X-Request-Id"] = request_id
    return JSONResponse(error.body(), status_code=error.status, headers=headers)


def _version() -> str:
    try:
        return package_version("kvmesh")
    except PackageNotFoundError:
        return "unknown"


def _request_id(request: Request) -> str | None:
    return getattr(request.state, "request_id", None)


class ObserveRequests:
    """ASGI middleware: counts finished requests by route template and status."""

    def __init__(self, app: ASGIApp, metrics: GatewayMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = [500]

        async def send_status(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = scope.get("route")
            path = getattr(route, "path", None) or "other"
            self.metrics.requests.labels(route=path, status=str(status[0])).inc()


def create_app(
    settings: GatewaySettings,
    backend: Backend,
    *,
    model: ServedModel | None = None,
    metrics: GatewayMetrics | None = None,
    mirror: MirrorTap | None = None,
) -> FastAPI:
    """The gateway app. `model` defaults to loading settings.model's tokenizer and config."""
    model = model or ServedModel.load(settings)
    metrics = metrics or GatewayMetrics()
    mirror = mirror or MirrorTap(settings.mirror_sample, settings.mirror_buffer, metrics, settings.nats_url)
    service = CompletionService(settings, backend, model, metrics, mirror)
    keys = ApiKeys(settings.api_key_set())
    workers = WorkerList(backend)  # one ListWorkers read shared by the context length and /health
    context_watch = ContextLengthWatch(workers, model, settings.pool, settings.context_refresh_s)

    loop_lag = LoopLag(metrics.loop_lag.observe)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        mirror.start()
        context_watch.start()
        loop_lag.start()
        freeze_startup_objects()
        yield
        await loop_lag.close()
        await context_watch.close()
        await mirror.close()
        await backend.close()

    # NOTE: FastAPI's own HTTP spans and metrics are off: `gateway.request` is the request's span and
    # /metrics has the request metrics; FastAPI's would double both and wrap every SSE chunk's send.
    app = FastAPI(title="kvmesh gateway", lifespan=lifespan, docs_url=None, redoc_url=None,
                  telemetry={"tracing": False, "metrics": False, "logs": False})
    app.state.service = service
    app.state.metrics = metrics
    app.state.mirror = mirror

    @app.exception_handler(ApiError)
    async def on_api_error(request: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc, _request_id(request))

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = (exc.errors() or [{}])[0]
        param = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        return error_response(ApiError(400, f"Invalid request: {first.get('msg', 'validation failed')}", param))

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return error_response(ApiError(exc.status_code, str(exc.detail), code=code))

    @app.exception_handler(Exception)
    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error serving %s", request.url.path, exc_info=exc)
        error = ApiError(500, f"Internal server error: {type(exc).__name__}", code="internal_error")
        return error_response(error, _request_id(request))

    async def completions(request: Request) -> Response:
        key = keys.check(request.headers.get("authorization"))
        return await service.handle(request, Endpoint.COMPLETIONS, key)

    async def chat_completions(request: Request) -> Response:
        key = keys.check(request.headers.get("authorization"))
        return await service.handle(request, Endpoint.CHAT, key)

    # NOTE: declared here for the OpenAPI schema; CompletionRoutes (below) serves their POSTs.
    fast = {"/v1/completions": (CompletionBody, completions), "/v1/chat/completions": (ChatBody, chat_completions)}
    for path, (body, handler) in fast.items():
        app.post(path, openapi_extra=openapi.request_body(body))(handler)

    def model_card() -> dict:
        return {
            "id": model.name,
            "object": "model",
            "created": model.created,
            "owned_by": "kvmesh",
            "root": model.name,
            "parent": None,
            "max_model_len": model.max_model_len,
        }

    @app.get("/v1/models")
    async def list_models(request: Request) -> dict:
        keys.check(request.headers.get("authorization"))
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str, request: Request) -> dict:
        keys.check(request.headers.get("authorization"))
        if model_id != model.name:
            raise model_not_found(model_id)
        return model_card()

    admin = ApiKeys(frozenset({settings.admin_key}))

    def check_admin(request: Request) -> None:
        if not settings.admin_key:
            raise ApiError(404, "Admin routes are off (set KVMESH_GATEWAY_ADMIN_KEY).", code="not_found")
        admin.check(request.headers.get("authorization"))

    # NOTE: auth as a dependency, so it is checked before the body is validated.
    @app.get("/admin/mirror", include_in_schema=False, dependencies=[Depends(check_admin)])
    async def get_mirror() -> dict:
        return {"sample": mirror.sample}

    @app.put("/admin/mirror", include_in_schema=False, dependencies=[Depends(check_admin)])
    async def put_mirror(update: MirrorUpdate) -> dict:
        mirror.set_sample(update.sample)
        log.info("mirror sample set to %g", update.sample)
        return {"sample": mirror.sample}

    @app.post("/tokenize", openapi_extra=openapi.request_body(TokenizeBody))
    async def tokenize_route(request: Request) -> dict:
        keys.check(request.headers.get("authorization"))
        body = validate_body(TokenizeBody, parse_json(await read_body(request, settings.max_body_bytes)))
        return await asyncio.to_thread(tokenize, model, body)

    @app.post("/detokenize", openapi_extra=openapi.request_body(DetokenizeBody))
    async def detokenize_route(request: Request) -> dict:
        keys.check(request.headers.get("authorization"))
        body = validate_body(DetokenizeBody, parse_json(await read_body(request, settings.max_body_bytes)))
        return await asyncio.to_thread(detokenize, model, body)

    @app.get("/version")
    async def version() -> dict:
        return {"version": _version()}

    @app.get("/health")
    async def health() -> JSONResponse:
        ready, why = await decode_workers_ready(workers, settings.pool)
        if ready:
            return JSONResponse({"status": "ok"})
        return JSONResponse({"status": "unavailable", "reason": why, "scheduler": settings.scheduler}, status_code=503)

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    openapi.install(app)
    routes = {route.path: route for route in app.routes if isinstance(route, APIRoute)}
    app.add_middleware(CompletionRoutes, routes={path: (routes[path], handler) for path, (_, handler) in fast.items()},
                       on_error=lambda exc, request: error_response(exc, _request_id(request)))
    app.add_middleware(ObserveRequests, metrics=metrics)  # NOTE: added last, so it is the outer one
    return app
