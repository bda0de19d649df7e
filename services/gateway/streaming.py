"""HTTP plumbing for long requests: an SSE response that notices a client going away, and a
race between work and the client disconnecting (`DisconnectWatch`)."""

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


class DisconnectWatch:
    """One request's watch for its client leaving: `race(work)` runs `work` and cancels it, raising
    ClientDisconnected, if the client leaves first; `close()` when the request is done.

    NOTE: `work` runs in the caller's own task; only the watch is a task of its own, which cancels
    the caller when the client leaves. A task for `work` (as before) put the first token's whole
    path (route, generate) one event-loop iteration later, and under a burst of new requests one
    iteration is every other request's ready work: a route waited ~7 ms p50 there in
    bench/tokcost.py's load at concurrency 32. One watch serves every race of a request (the first
    token's, then the stream's or the whole response's): a watch task a race cost the gateway a
    task more per request.
    """

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self._task: asyncio.Task | None = None
        self._caller: asyncio.Task | None = None  # the task in a race now, cancelled if the client leaves
        self.left = False

    async def race(self, work: Awaitable[T]) -> T:
        if self.left:
            _close_unawaited(work)
            raise ClientDisconnected()
        caller = asyncio.current_task()
        assert caller is not None
        self._caller = caller
        if self._task is None:
            self._task = asyncio.ensure_future(self._watch())
        try:
            result = await work
        except asyncio.CancelledError:
            if not self.left:
                raise  # cancelled from outside (shutdown): not the client
            caller.uncancel()
            raise ClientDisconnected() from None
        finally:
            self._caller = None
        if self.left:  # NOTE: the work swallowed the cancel and finished: its result stands, as before
            caller.uncancel()
        return result

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _watch(self) -> None:
        await wait_disconnect(self._receive)
        self.left = True
        if self._caller is not None:
            self._caller.cancel()


def _close_unawaited(work: Awaitable) -> None:
    close = getattr(work, "close", None)  # a coroutine never started: no "never awaited" warning
    if close is not None:
        close()


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
    the stream ended or the client left, so the caller can abort work downstream. `on_close` runs
    in the request's task: what a cancel of it must not cut short, it shields itself. An event ending
    with `last` ends the body (the stream's iterator is not read further). `watch`: the request's
    `DisconnectWatch` (closed here), if it has one already.
    """

    media_type = "text/event-stream"

    def __init__(
        self,
        events: AsyncIterator[bytes],
        on_close: Callable[[bool], Awaitable[None]],
        headers: Mapping[str, str] | None = None,
        last: bytes | None = None,
        watch: DisconnectWatch | None = None,
    ) -> None:
        self.events = events
        self.on_close = on_close
        self.last = last
        self.watch = watch
        self.status_code = 200
        self.background = None
        self.init_headers({"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(headers or {})})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # NOTE: the events are pumped in this task, raced against the client leaving (the
        # request's `DisconnectWatch`: one task); a pump task and a watch task, awaited together,
        # cost the gateway a task and an asyncio.wait more per request.
        disconnected = True
        watch = self.watch or DisconnectWatch(receive)
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            ended = await watch.race(self._pump(scope.get(RAW_SEND) or send))
            disconnected = False
            if not ended:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except (ClientDisconnected, OSError):
            disconnected = True
        except Exception:  # noqa: BLE001 - a failing stream ends like a client that left (its downstream work is aborted)
            log.exception("an event stream failed")
            disconnected = True
        finally:
            watch.close()
            with contextlib.suppress(Exception):
                await self.events.aclose()  # type: ignore[attr-defined]
            await self.on_close(disconnected)

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
