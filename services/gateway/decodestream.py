"""The gateway side of the multiplexed token stream (docs/token-stream.md).

One `DecodeStream` per decode worker carries every request the gateway runs there: `open`
sends a `generate`, `abort` an `abort`, and one reader task hands each `StepOutput`'s deltas to
the requests' `RequestFeed`s. A feed merges what arrives until its reader takes it, so a slow
client's tokens coalesce into one chunk while other requests keep their pace. When the stream
breaks (the worker died) every open feed fails with the stream's status, and each request
migrates on its own.
"""

from __future__ import annotations

import asyncio
import logging

import grpc

from kvmesh.runtime.pb import decode_pb2, decode_pb2_grpc

from .bidicall import BidiCall

log = logging.getLogger(__name__)


class StreamFailed(Exception):
    """The request's stream (or the request on it) failed; `code` says how."""

    def __init__(self, code: grpc.StatusCode, details: str, retry_after_s: float | None = None) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details
        self.retry_after_s = retry_after_s


_CODES = {c.value[0]: c for c in grpc.StatusCode}


class RequestFeed:
    """What one request has received and not yet read (merged); `read()` waits for more."""

    __slots__ = ("token_ids", "logprobs", "prompt_logprobs", "finish_reason", "usage", "cached_tokens", "error", "_waiter",
                 "_loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop  # NOTE: get_running_loop() per read costs a getpid() syscall on Python 3.11
        self.token_ids: list[int] = []
        self.logprobs: list = []  # common_pb2.TokenLogprob
        self.prompt_logprobs: list = []  # common_pb2.TokenLogprob of prompt tokens 1.. (echo), taken once
        self.finish_reason = ""
        self.usage = None  # common_pb2.Usage on the last delta
        self.cached_tokens: int | None = None
        self.error: StreamFailed | None = None
        self._waiter: asyncio.Future | None = None  # NOTE: a bare future, made only while a reader waits

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def push(self, delta: decode_pb2.RequestDelta) -> bool:
        """Take in `delta`; True when it ends the request (finished or failed)."""
        ids = delta.token_ids
        if ids:
            self.token_ids.extend(ids)
        if delta.logprobs:
            self.logprobs.extend(delta.logprobs)
        if delta.prompt_logprobs:
            self.prompt_logprobs.extend(delta.prompt_logprobs)
        finish = delta.finish_reason
        if self.cached_tokens is None and (ids or finish):
            self.cached_tokens = delta.cached_tokens
        ended = True
        if delta.error_code:
            code = _CODES.get(delta.error_code, grpc.StatusCode.UNKNOWN)
            self.error = StreamFailed(code, delta.error_message, delta.retry_after_s or None)
        elif finish:
            self.finish_reason = finish
            self.usage = delta.usage
        else:
            ended = False
        self._wake()
        return ended

    def fail(self, error: StreamFailed) -> None:
        if self.error is None and not self.finish_reason:
            self.error = error
            self._wake()

    async def read(self) -> tuple[list[int], list, str]:
        """(new token ids, their logprobs, finish reason or ""); raises StreamFailed after the
        tokens that came before the failure were read."""
        while not self.token_ids and not self.finish_reason and self.error is None:
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        tokens, logprobs, self.token_ids, self.logprobs = self.token_ids, self.logprobs, [], []
        if not tokens and self.error is not None:
            raise self.error
        finish = self.finish_reason if self.error is None else ""
        return tokens, logprobs, finish


class DecodeStream(BidiCall):
    """One open `DecodeWorker.Stream` call; see the module docstring. Every request on it has its
    own deadline, enforced (abort) by its Generation."""

    def __init__(self, endpoint: str, stub: decode_pb2_grpc.DecodeWorkerStub) -> None:
        self._feeds: dict[str, RequestFeed] = {}
        super().__init__(endpoint, stub.Stream, "decode-stream")

    def _batch(self, messages: list[decode_pb2.StreamRequest]) -> decode_pb2.StreamRequest:
        return decode_pb2.StreamRequest(batch=decode_pb2.StreamBatch(frames=messages))

    @property
    def num_open(self) -> int:
        return len(self._feeds)

    def open(self, request: decode_pb2.GenerateRequest) -> RequestFeed:
        feed = RequestFeed(self._loop)
        if self.closed:
            feed.fail(StreamFailed(grpc.StatusCode.UNAVAILABLE, "the token stream is closed"))
            return feed
        self._feeds[request.request_id] = feed
        self.send(decode_pb2.StreamRequest(generate=request))
        return feed

    def abort(self, request_id: str) -> None:
        """Stop the request on the worker; nothing more is delivered for it."""
        if self._feeds.pop(request_id, None) is not None and not self.closed:
            self.send(decode_pb2.StreamRequest(abort=decode_pb2.AbortRequest(request_id=request_id)))

    def forget(self, request_id: str) -> None:
        self._feeds.pop(request_id, None)

    async def _read(self) -> None:
        error = StreamFailed(grpc.StatusCode.UNAVAILABLE, "the token stream ended")
        try:
            async for out in self._frames():
                feeds = self._feeds
                for delta in out.deltas:
                    feed = feeds.get(delta.request_id)
                    if feed is None:
                        continue  # aborted or forgotten: late tokens are dropped
                    if feed.push(delta):
                        del feeds[delta.request_id]
        except grpc.aio.AioRpcError as exc:
            error = StreamFailed(exc.code(), exc.details() or "the token stream failed")
        except asyncio.CancelledError:
            error = StreamFailed(grpc.StatusCode.CANCELLED, "the gateway closed the token stream")
        except Exception as exc:  # noqa: BLE001 - every request on it must hear about it
            log.exception("token stream to %s failed", self.endpoint)
            error = StreamFailed(grpc.StatusCode.INTERNAL, f"token stream error: {exc}")
        finally:
            self.closed = True
            feeds, self._feeds = self._feeds, {}
            if feeds:
                log.warning("token stream to %s ended (%s) with %d open requests", self.endpoint, error, len(feeds))
            for feed in feeds.values():
                feed.fail(error)


class DecodeStreams:
    """One live DecodeStream per worker endpoint, reopened after it ends."""

    def __init__(self, stub_for) -> None:
        self._stub_for = stub_for
        self._streams: dict[str, DecodeStream] = {}

    def get(self, endpoint: str) -> DecodeStream:
        stream = self._streams.get(endpoint)
        if stream is None or stream.closed:
            stream = self._streams[endpoint] = DecodeStream(endpoint, self._stub_for(endpoint))
        return stream

    async def close(self) -> None:
        streams, self._streams = list(self._streams.values()), {}
        for stream in streams:
            await stream.close()
