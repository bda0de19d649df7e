"""The two completion routes, served straight from the middleware chain instead of through
FastAPI's router.

Starlette's ExceptionMiddleware, FastAPI's exit stack, the router's match over every route and
FastAPI's request/response wrappers cost ~1/5 of the gateway's CPU per request (py-spy, a load
of 2-token requests at concurrency 32), and these routes use none of them: they read their own
body, validate it themselves and answer errors in OpenAI's shape. Every other path, and any
other method on these paths, still goes to FastAPI, which also keeps the routes in the OpenAPI
schema.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from .errors import ApiError

# a completion route: the request -> its response; may raise ApiError
Handler = Callable[[Request], Awaitable[Response]]
ErrorResponse = Callable[[ApiError, Request], Response]


class CompletionRoutes:
    """ASGI middleware: POSTs to the paths in `routes` go to their handler; all else to `app`.

    It sets `scope["route"]` to the FastAPI route of the same path, as the router would, so
    `ObserveRequests` (outside it) labels the request metrics the same either way. An ApiError
    becomes `on_error`'s response, as FastAPI's exception handler would make it; any other
    exception goes up to Starlette's ServerErrorMiddleware, the same as from a FastAPI route.
    """

    def __init__(self, app: ASGIApp, routes: Mapping[str, tuple[BaseRoute, Handler]], on_error: ErrorResponse) -> None:
        self.app = app
        self.routes = dict(routes)
        self.on_error = on_error

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        target = self.routes.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if target is None:
            await self.app(scope, receive, send)
            return
        route, handler = target
        scope["route"] = route
        request = Request(scope, receive, send)
        try:
            response = await handler(request)
        except ApiError as exc:
            response = self.on_error(exc, request)
        await response(scope, receive, send)
