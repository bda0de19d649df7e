"""The scheduler side of the Routes stream: Route and Complete for many requests on one call
(docs/contracts.md, "The Routes stream").

One `RouteStreamSession` serves one gateway's stream. Each `route` runs as its own task through
the same code as the unary Route (`SchedulerServicer.route`), so a route waiting for admission
holds up nobody else on the stream; its answer (or error, with the status the unary Route would
have) leaves as one `RouteStreamResponse` when it is ready. A `complete` releases the request at
once, like the unary Complete, and cancels its route if that is still in progress. When the
stream ends, routes still in progress are cancelled (their admission places are freed); requests
already routed stay assigned until their Complete comes (on another stream or unary) or are
reclaimed like those of a gateway that died (registry reconciliation, admission slot timeout).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import grpc

from kvmesh.runtime.errors import ResourceExhausted
from kvmesh.runtime.grpcutil import error_status, take_ready, unpacked
from kvmesh.runtime.pb import scheduler_pb2
from kvmesh.runtime.telemetry import extract_context

from . import metrics

if TYPE_CHECKING:
    from .server import SchedulerServicer

log = logging.getLogger(__name__)


class RouteStreamSession:
    """Serves one `Routes` call; see the module docstring."""

    def __init__(self, servicer: SchedulerServicer, batch_replies: bool = False) -> None:
        self.servicer = servicer
        self.batch_replies = batch_replies  # the client reads answers packed in one frame
        self._routing: dict[str, asyncio.Task] = {}  # request id -> its route in progress
        self._outbox: asyncio.Queue[scheduler_pb2.RouteStreamResponse | None] = asyncio.Queue()  # None: the end
        self._reading = True
        self._error: Exception | None = None  # a frame that did not parse: ends the stream with its status

    async def serve(
        self, requests: AsyncIterator[scheduler_pb2.RouteStreamRequest]
    ) -> AsyncIterator[scheduler_pb2.RouteStreamResponse]:
        reader = asyncio.create_task(self._read(requests), name="route-stream-reader")
        try:
            while True:
                ready = await take_ready(self._outbox)
                if self.batch_replies and len(ready) > 1:
                    yield scheduler_pb2.RouteStreamResponse(batch=[r for r in ready if r is not None])
                else:
                    for out in ready:
                        if out is not None:
                            yield out
                if ready[-1] is None:
                    break
            if self._error is not None:
                raise self._error
        finally:
            reader.cancel()
            for task in list(self._routing.values()):
                task.cancel()

    async def _read(self, requests: AsyncIterator[scheduler_pb2.RouteStreamRequest]) -> None:
        try:
            async for msg in requests:
                metrics.ROUTE_STREAM_FRAMES.labels(msg.WhichOneof("msg") or "empty").inc()
                for frame in unpacked(msg):
                    self._handle(frame)
        except Exception as exc:  # noqa: BLE001 - answered as the stream's status
            self._error = exc
            self._outbox.put_nowait(None)
        finally:
            self._reading = False
            self._end_when_idle()

    def _handle(self, msg: scheduler_pb2.RouteStreamRequest) -> None:
        kind = msg.WhichOneof("msg")
        if kind == "route":
            self._start(msg.route)
        elif kind == "complete":
            self._complete(msg.complete.request_id)

    def _end_when_idle(self) -> None:
        """A client that half-closed still gets the answers of the routes it sent."""
        if not self._reading and not self._routing:
            self._outbox.put_nowait(None)

    def _start(self, streamed: scheduler_pb2.StreamedRoute) -> None:
        request_id = streamed.request.request_id
        if request_id in self._routing:
            self._outbox.put_nowait(_error(request_id, grpc.StatusCode.INVALID_ARGUMENT,
                                           f"request {request_id} is already being routed on this stream"))
            return
        task = asyncio.create_task(self._route(streamed), name=f"route-{request_id}")
        if request_id:  # NOTE: an empty id fails validation at once; it is never tracked
            self._routing[request_id] = task
            task.add_done_callback(lambda _t, rid=request_id: self._forget(rid, task))

    def _forget(self, request_id: str, task: asyncio.Task) -> None:
        if self._routing.get(request_id) is task:
            del self._routing[request_id]
            self._end_when_idle()

    async def _route(self, streamed: scheduler_pb2.StreamedRoute) -> None:
        request = streamed.request
        # NOTE: always this request's own trace context (empty = a new trace), never the stream's.
        parent = extract_context(dict(streamed.trace_context))
        try:
            if streamed.timeout_s > 0:
                async with asyncio.timeout(streamed.timeout_s):
                    reply = await self.servicer.route(request, parent)
            else:
                reply = await self.servicer.route(request, parent)
        except asyncio.CancelledError:
            raise  # the caller completed it, or the stream ended: nobody waits for an answer
        except Exception as exc:  # noqa: BLE001 - this route fails, the stream goes on
            self._outbox.put_nowait(_failure(request.request_id, exc))
            return
        self._outbox.put_nowait(scheduler_pb2.RouteStreamResponse(request_id=request.request_id, route=reply))

    def _complete(self, request_id: str) -> None:
        if not request_id:
            log.debug("a complete without request_id on the route stream: ignored")
            return
        task = self._routing.pop(request_id, None)
        if task is not None:
            task.cancel()  # the caller gave up on this route (its deadline passed, its client left)
        self.servicer.complete(request_id)
        if task is not None:
            self._end_when_idle()


def _failure(request_id: str, exc: Exception) -> scheduler_pb2.RouteStreamResponse:
    """The error reply of a route that raised `exc`: the status and message the unary Route answers."""
    reply = _error(request_id, *error_status(exc))
    if isinstance(exc, ResourceExhausted):
        reply.retry_after_s = exc.retry_after_s
    return reply


def _error(request_id: str, code: grpc.StatusCode, message: str) -> scheduler_pb2.RouteStreamResponse:
    return scheduler_pb2.RouteStreamResponse(request_id=request_id, error_code=code.value[0], error_message=message)
