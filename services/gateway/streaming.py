"""HTTP plumbing for long requests: an SSE response that notices a client going away, and a
race between work and the client disconnecting (for non-streaming requests)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import TypeVar

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

T = TypeVar("T")
log = logging.getLogger(__name__)


class ClientDisconnected(Exception):
    """The HTTP client went away before the response was complete."""


async def wait_disconnect(receive: Receive) -> None:
    """Returns once the ASGI server reports `http.disconnect` (the body was already read)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def race_disconnect(receive: Receive, work: Awaitable[T]) -> T:
    """Runs `work`; cancels it and raises ClientDisconnected if the client leaves first.

    NOTE: `work` runs in the caller's own task; only the disconnect watch is a task of its own,
    which cancels the caller when the client leaves. A task for `work` (as before) put the first
    token's whole path (route, generate) one event-loop iteration later, and under a burst of new
    requests one iteration is every other request's ready work: a route waited ~7 ms p50 there in
    bench/tokcost.py's load at concurrency 32.
    """
    caller = asyncio.current_task()
    assert caller is not None
    left = False

    async def watch() -> None:
        nonlocal left
        await wait_disconnect(receive)
        left = True
        caller.cancel()

    watcher = asyncio.ensure_future(watch())
    try:
        result = await work
    except asyncio.CancelledError:
        if not left:
            raise  # cancelled from outside (shutdown): not the client
        caller.uncancel()
        raise ClientDisconnected() from None
    finally:
        watcher.cancel()
    if left:  # NOTE: the work swallowed the cancel and finished: its result stands, as before
        caller.uncancel()
    return result


RAW_SEND = "kvmesh.raw_send"  # scope key: the ASGI server's own `send` (see `RawSend`)


class RawSend:
    """Outermost ASGI wrapper (around the whole app): keeps the server's own `send` in the scope.

    An event stream sends its `http.response.start` through the middleware chain as usual, then
    its body chunks straight to the server: Starlette's error and exception middleware and
    `ObserveRequests` only look at the start message, and their three wrapper coroutines per SSE
    chunk were a large part of the gateway's cost per token.
    """

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope[RAW_SEND] = send
        await self.app(scope, receive, send)


class EventStreamResponse(Response):
    """`text/event-stream` from an async iterator of encoded events.

    Unlike a plain StreamingResponse it always calls `on_close(disconnected)` exactly once, after
    the stream ended or the client left, so the caller can abort work downstream. An event ending
    with `last` ends the body (the stream's iterator is not read further).
    """

    media_type = "text/event-stream"

    def __init__(
        self,
        events: AsyncIterator[bytes],
        on_close: Callable[[bool], Awaitable[None]],
        headers: Mapping[str, str] | None = None,
        last: bytes | None = None,
    ) -> None:
        self.events = events
        self.on_close = on_close
        self.last = last
        self.status_code = 200
        self.background = None
        self.init_headers({"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(headers or {})})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # NOTE: the events are pumped in this task, raced against the client leaving
        # (`race_disconnect`: one watcher task); a pump task and a watch task, awaited together,
        # cost the gateway a task and an asyncio.wait more per request.
        disconnected = True
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            ended = await race_disconnect(receive, self._pump(scope.get(RAW_SEND) or send))
            disconnected = False
            if not ended:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except (ClientDisconnected, OSError):
            disconnected = True
        except Exception:  # noqa: BLE001 - a failing stream ends like a client that left (its downstream work is aborted)
            log.exception("an event stream failed")
            disconnected = True
        finally:
            with contextlib.suppress(Exception):
                await self.events.aclose()  # type: ignore[attr-defined]
            await asyncio.shield(self.on_close(disconnected))

    async def _pump(self, send: Send) -> bool:
        """Sends every event; True if the last one went out with the body's end."""
        async for chunk in self.events:
            # NOTE: the stream's last event carries the body's end in the same write: a client (a
            # closed loop, the openai client draining after [DONE]) waits for that end, and sending it
            # after this task and the disconnect watch are torn down cost a loaded gateway ~ms per request
            last = self.last is not None and chunk.endswith(self.last)
            await send({"type": "http.response.body", "body": chunk, "more_body": not last})
            if last:
                return True
        return False
