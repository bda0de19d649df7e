"""The gateway side of the Routes stream: Route and Complete multiplexed on one long-lived
`Scheduler.Routes` call per scheduler replica (docs/contracts.md, "The Routes stream").

A unary Route plus a unary Complete cost each side a new HTTP/2 stream, metadata and a server
span per request; a message on an open stream costs a fraction of that. `RouteStream.route`
sends a `route` and waits for the answer with the same request id; its failures are raised as
the `grpc.aio.AioRpcError` a unary Route would raise (status, details, "retry-after" trailer), so
failover (backend.py) treats both paths alike. When the stream breaks, every route in flight on it
fails UNAVAILABLE (and fails over); the next route reopens it. The deadline of each route is
enforced here, and sent along so the scheduler stops waiting too.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping

import grpc

from kvmesh.runtime.grpcutil import BATCH_METADATA
from kvmesh.runtime.pb import scheduler_pb2, scheduler_pb2_grpc

from .bidicall import BidiCall

log = logging.getLogger(__name__)

# NOTE: a replica that answers UNIMPLEMENTED (an older scheduler, another implementation) is
# asked unary for this long, then the stream is tried again (it may have been upgraded).
UNSUPPORTED_RETRY_S = 60.0
_CODES = {c.value[0]: c for c in grpc.StatusCode}


def _unimplemented(exc: grpc.aio.AioRpcError, unanswered: bool) -> bool:
    """The stream's peer has no Routes method. NOTE: grpc-python sometimes ends a stream-stream call
    to an unimplemented method with its own INTERNAL "Internal error from Core" instead of the peer's
    UNIMPLEMENTED (grpc/grpc#36066: a write racing the call's end); before any frame came back that
    is taken as UNIMPLEMENTED (the gateway conformance suite's stub scheduler once got a 503 from it;
    a replica that does have the stream is then asked unary, and for the stream again later)."""
    if exc.code() is grpc.StatusCode.UNIMPLEMENTED:
        return True
    return unanswered and exc.code() is grpc.StatusCode.INTERNAL and "Internal error from Core" in (exc.details() or "")


def route_error(code: grpc.StatusCode, details: str, retry_after_s: float = 0.0) -> grpc.aio.AioRpcError:
    """The error a unary Route with this outcome raises."""
    trailers = grpc.aio.Metadata(("retry-after", f"{retry_after_s:g}")) if retry_after_s else grpc.aio.Metadata()
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), trailers, details)


class RouteStream(BidiCall):
    """One open `Scheduler.Routes` call; see the module docstring."""

    def __init__(self, endpoint: str, stub: scheduler_pb2_grpc.SchedulerStub) -> None:
        self._waiting: dict[str, asyncio.Future[scheduler_pb2.RouteResponse]] = {}
        super().__init__(endpoint, lambda frames: stub.Routes(frames, metadata=(BATCH_METADATA,)), "route-stream")

    def _batch(self, messages: list[scheduler_pb2.RouteStreamRequest]) -> scheduler_pb2.RouteStreamRequest:
        return scheduler_pb2.RouteStreamRequest(batch=scheduler_pb2.RouteStreamBatch(frames=messages))

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    async def route(
        self, request: scheduler_pb2.RouteRequest, trace_context: Mapping[str, str], timeout: float
    ) -> scheduler_pb2.RouteResponse:
        """The scheduler's answer to `request`; raises grpc.aio.AioRpcError as a unary Route would."""
        request_id = request.request_id
        if self.closed:
            raise route_error(grpc.StatusCode.UNAVAILABLE, "the route stream is closed")
        if request_id in self._waiting:
            raise route_error(grpc.StatusCode.INVALID_ARGUMENT, f"request {request_id} is already being routed")
        future = self._waiting[request_id] = self._loop.create_future()
        timer = self._loop.call_later(timeout, _deadline, future)  # NOTE: its error is built only if it fires
        streamed = scheduler_pb2.StreamedRoute(request=request, trace_context=trace_context, timeout_s=timeout)
        self.send(scheduler_pb2.RouteStreamRequest(route=streamed))
        try:
            return await future
        finally:
            timer.cancel()
            if self._waiting.get(request_id) is future:
                del self._waiting[request_id]

    def complete(self, request: scheduler_pb2.CompleteRequest) -> bool:
        """Sends a Complete (not answered); False when the stream is closed (use the unary call)."""
        if self.closed:
            return False
        self.send(scheduler_pb2.RouteStreamRequest(complete=request))
        return True

    def _answer(self, out: scheduler_pb2.RouteStreamResponse) -> None:
        future = self._waiting.pop(out.request_id, None)
        if future is None or future.done():
            return  # its caller gave up (deadline, client gone)
        if out.error_code:
            code = _CODES.get(out.error_code, grpc.StatusCode.UNKNOWN)
            future.set_exception(route_error(code, out.error_message, out.retry_after_s))
        else:
            future.set_result(out.route)

    async def _read(self) -> None:
        error = route_error(grpc.StatusCode.UNAVAILABLE, "the route stream ended")
        try:
            async for frame in self._frames():
                for out in frame.batch or (frame,):
                    self._answer(out)
        except grpc.aio.AioRpcError as exc:
            # NOTE: UNIMPLEMENTED stays itself (the caller then routes unary); anything else is
            # UNAVAILABLE, so every route in flight fails over to the next replica.
            code = grpc.StatusCode.UNIMPLEMENTED if _unimplemented(exc, self.packs is None) else grpc.StatusCode.UNAVAILABLE
            error = route_error(code, f"route stream to {self.endpoint} failed: {exc.code().name}: {exc.details()}")
        except asyncio.CancelledError:
            error = route_error(grpc.StatusCode.UNAVAILABLE, "the gateway closed the route stream")
        except Exception as exc:  # noqa: BLE001 - every route on it must hear about it
            log.exception("route stream to %s failed", self.endpoint)
            error = route_error(grpc.StatusCode.UNAVAILABLE, f"route stream error: {exc}")
        finally:
            self.closed = True
            self._outbox.put_nowait(None)
            waiting, self._waiting = self._waiting, {}
            if waiting:
                log.warning("route stream to %s ended (%s) with %d routes in flight", self.endpoint, error.code().name,
                            len(waiting))
            for future in waiting.values():
                _fail(future, error)


def _fail(future: asyncio.Future, error: grpc.aio.AioRpcError) -> None:
    if not future.done():
        future.set_exception(error)


def _deadline(future: asyncio.Future) -> None:
    _fail(future, route_error(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"))


class RouteStreams:
    """One live RouteStream per scheduler replica, reopened after it ends; replicas that lack
    the RPC are remembered (asked unary) for UNSUPPORTED_RETRY_S."""

    def __init__(self, stub_for: Callable[[str], scheduler_pb2_grpc.SchedulerStub],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._stub_for = stub_for
        self._clock = clock
        self._streams: dict[str, RouteStream] = {}
        self._unsupported_until: dict[str, float] = {}

    def supported(self, endpoint: str) -> bool:
        until = self._unsupported_until.get(endpoint)
        if until is None:
            return True
        if self._clock() < until:
            return False
        del self._unsupported_until[endpoint]
        return True

    def unsupported(self, endpoint: str) -> None:
        if endpoint not in self._unsupported_until:
            log.info("scheduler %s has no Routes stream: Route and Complete go unary there", endpoint)
        self._unsupported_until[endpoint] = self._clock() + UNSUPPORTED_RETRY_S

    def get(self, endpoint: str) -> RouteStream:
        """The replica's stream, opened (or reopened) now when it has none."""
        stream = self._streams.get(endpoint)
        if stream is None or stream.closed:
            stream = self._streams[endpoint] = RouteStream(endpoint, self._stub_for(endpoint))
        return stream

    def open(self, endpoint: str) -> RouteStream | None:
        """The replica's stream when one is open; never opens one."""
        stream = self._streams.get(endpoint)
        return stream if stream is not None and not stream.closed else None

    async def close(self) -> None:
        streams, self._streams = list(self._streams.values()), {}
        for stream in streams:
            await stream.close()
