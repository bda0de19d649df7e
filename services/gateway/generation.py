"""One request's way through the mesh: Scheduler.Route → the decode worker's token stream →
Scheduler.Complete, yielding `Delta`s.

The worker sends token ids only; the text is made here, incrementally (`TextAssembler`), and
stop strings are checked here: on a match the request ends at once and the worker is sent an
abort. When its decode worker fails mid-stream (UNAVAILABLE, cancelled by the peer, a dropped
connection, a stream that ends without a finish reason) it re-routes, excluding the failed
worker, and continues from prompt + the tokens generated so far with the remaining max_tokens,
so the client sees no lost or duplicated tokens (the text assembler simply goes on).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc
from opentelemetry import trace

from kvmesh.runtime.pb import decode_pb2, scheduler_pb2
from kvmesh.runtime.telemetry import inject_metadata

from .decodestream import DecodeStream, RequestFeed, StreamFailed
from .errors import ApiError
from .outputs import Delta, Usage
from .protocol import SamplingSpec
from .text import TextAssembler
from .wire import api_error_from_grpc, logprobs_from_pb, retry_after_from, sampling_pb

if TYPE_CHECKING:
    from .backend import Backend

log = logging.getLogger(__name__)

# Failures of a decode worker after which the request moves to another worker.
MIGRATABLE = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.DATA_LOSS,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    }
)
SIDE_CALL_TIMEOUT_S = 2.0  # Complete / Abort / health: best-effort, short


def request_metadata(request_id: str, carrier: tuple[tuple[str, str], ...] | None = None) -> tuple[tuple[str, str], ...]:
    """gRPC metadata of a call made for one request: its trace context (`carrier`, or the current
    one injected now) and its id."""
    return (*(inject_metadata() if carrier is None else carrier), ("x-request-id", request_id))


@dataclass(slots=True)
class GenerationJob:
    request_id: str
    session_id: str
    model: str
    prompt_token_ids: list[int]
    block_hashes: list[bytes]
    sampling: SamplingSpec
    max_tokens: int
    priority: int = 0  # lower runs first


class Generation:
    """One request's stream of `Delta`s: `await next()` until None, then `await close()`."""

    def __init__(self, backend: Backend, job: GenerationJob, span: trace.Span) -> None:
        self.backend = backend
        self.job = job
        self.span = span
        self.output_token_ids: list[int] = []
        self.usage: Usage | None = None
        self.finish_reason: str | None = None
        self.migrations = 0
        self.status = "ok"
        self.pool = ""  # the pool that served the request (its last route)
        self._deadline = asyncio.get_running_loop().time() + backend.settings.request_timeout_s
        self._exclude: list[str] = []
        self._route: scheduler_pb2.RouteResponse | None = None  # routed, Complete not yet sent
        self._routing = False  # a Route call is in flight (or ended without an answer)
        self._schedulers: list[str] = []  # replicas asked to route; the last one routed (gets Complete)
        self._stream: DecodeStream | None = None
        self._feed: RequestFeed | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._text = TextAssembler(backend.tokenizer, job.prompt_token_ids, job.sampling.stop) if backend.tokenizer else None
        self._cached_tokens: int | None = None
        self._done = False

    @property
    def remaining_tokens(self) -> int:
        return self.job.max_tokens - len(self.output_token_ids)

    async def next(self) -> Delta | None:
        """The next delta; None once finished. Raises ApiError when the request cannot be served."""
        while not self._done:
            if self._feed is None:
                await self._start_attempt()
            assert self._feed is not None
            try:
                tokens, logprobs, finish = await self._feed.read()
            except StreamFailed as exc:
                final = await self._fail(exc.code, exc.details, exc.retry_after_s)
                if final is not None:
                    return final
                continue
            if self._cached_tokens is None:
                self._cached_tokens = self._feed.cached_tokens
            if finish == "abort":
                # NOTE: we did not ask for it (a draining or failing worker did): keep its tokens, move on.
                self._end_attempt()
                self._feed = _FAILED
                finish = ""
            delta = await self._consume(tokens, logprobs, finish)
            if delta is not None:
                return delta
        return None

    @property
    def settled(self) -> bool:
        """Nothing owed downstream: `close()` returns at once (not routing, Complete sent or never owed)."""
        return self._route is None and not self._routing

    async def close(self, aborted: bool = False) -> None:
        """Ends the request. When it is unfinished (client gone, or the caller gave up) the worker
        is sent an abort on the stream; the scheduler's slot is always released. Idempotent."""
        self._done = True
        route = self._route
        if route is None and not self._routing:
            return
        self.status = "aborted" if aborted else "error"
        self._end_attempt(abort=True)
        await self._complete(self.status)

    # -- attempts --------------------------------------------------------------------------
    async def _start_attempt(self) -> None:
        job, backend = self.job, self.backend
        prompt = job.prompt_token_ids + self.output_token_ids
        hashes = job.block_hashes if not self.output_token_ids else backend.hasher.hashes(prompt)
        route_req = scheduler_pb2.RouteRequest(
            request_id=job.request_id,
            session_id=job.session_id,
            model=job.model,
            num_prompt_tokens=len(prompt),
            block_hashes=hashes,
            max_tokens=self.remaining_tokens,
            pool=backend.settings.pool,
            exclude_workers=self._exclude,
            priority=job.priority,
        )
        timeout = min(backend.settings.route_timeout_s, self._time_left())
        with trace.use_span(self.span, end_on_exit=False):
            # NOTE: from here until a reply, the scheduler may have admitted the request even if
            # we never learn it (deadline, cancellation): then Complete is still owed.
            self._routing = True
            carrier = inject_metadata()  # NOTE: once: the route and the generate carry the same context
            try:
                route = await backend.route(route_req, timeout, request_metadata(job.request_id, carrier), self._schedulers)
            except grpc.aio.AioRpcError as exc:
                self._done = True
                self.status = "error"
                if exc.code() in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED):
                    await self._complete("error")
                self._routing = False
                raise api_error_from_grpc(exc.code(), exc.details() or "", retry_after_from(exc.trailing_metadata())) from None
            self._route, self._routing = route, False
            self.pool = route.pool
            gen_req = decode_pb2.GenerateRequest(
                request_id=job.request_id,
                prompt_token_ids=prompt,
                sampling=sampling_pb(job.sampling, self.remaining_tokens, job.priority),
                session_id=job.session_id,
            )
            if not route.local_prefill and route.HasField("prefill"):
                gen_req.prefill.CopyFrom(route.prefill)
            gen_req.trace_context.update(carrier)
            self._stream = backend.streams.get(route.decode.endpoint)
            self._feed = self._stream.open(gen_req)
            feed, left = self._feed, self._time_left()
            self._timer = asyncio.get_running_loop().call_later(
                left, feed.fail, StreamFailed(grpc.StatusCode.DEADLINE_EXCEEDED, "request deadline exceeded")
            )
        self.span.add_event("routed", {"kvmesh.decode": route.decode.worker_id, "kvmesh.attempt": self.migrations})

    async def _fail(self, code: grpc.StatusCode, details: str, retry_after_s: float | None = None) -> Delta | None:
        """The current attempt failed: migrate to another worker (None: go on), finish from the
        tokens already streamed (the final Delta), or raise when neither is possible."""
        route = self._route
        self._end_attempt(abort=code is grpc.StatusCode.DEADLINE_EXCEEDED)
        self._feed = None
        self.status = "error"
        await self._complete("error")
        failed = route.decode.worker_id if route is not None else ""
        log.warning("request %s: decode worker %s failed (%s: %s)", self.job.request_id, failed, code.name, details)
        if code not in MIGRATABLE:
            self._done = True
            if code is grpc.StatusCode.DEADLINE_EXCEEDED:
                raise ApiError(504, "The request timed out.", code="timeout")
            raise api_error_from_grpc(code, details, retry_after_s)
        final = self._finish_without_worker()
        if final is not None:
            return final
        if self.migrations >= self.backend.settings.max_migrations:
            self._done = True
            if code is grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise api_error_from_grpc(code, details, retry_after_s)
            raise ApiError(
                503,
                f"The decode worker failed and the request could not be moved to another worker "
                f"after {self.migrations} migration(s): {code.name}: {details}",
                code="worker_failed",
            )
        self.migrations += 1
        self.status = "ok"
        if failed:
            self._exclude.append(failed)
        self.span.add_event("migrating", {"kvmesh.failed_worker": failed, "kvmesh.tokens_so_far": len(self.output_token_ids)})
        return None

    def _finish_without_worker(self) -> Delta | None:
        """The final delta when the tokens already streamed end the request (its finish was lost)."""
        out = self.output_token_ids
        if not out:
            return None
        sampling = self.job.sampling
        if out[-1] in sampling.stop_token_ids or (not sampling.ignore_eos and out[-1] in self.backend.eos_token_ids):
            reason = "stop"
        elif self.remaining_tokens <= 0:
            reason = "length"
        else:
            return None
        return self._finish(Delta(text=self._text.finish() if self._text else "", finish_reason=reason))

    def _end_attempt(self, abort: bool = False) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._stream is not None and self._route is not None:
            if abort:
                self._stream.abort(self.job.request_id)
            else:
                self._stream.forget(self.job.request_id)
        self._stream = None

    async def _consume(self, tokens: list[int], logprobs: list, finish: str) -> Delta | None:
        """The delta for what arrived (None when it shows nothing yet); ends the request on a
        finish reason or a stop string."""
        text = ""
        stop_at = None
        if self._text is not None:
            # NOTE: a "stop" from the worker means its last token is a stop token id (EOS or
            # stop_token_ids): it ends the request without text, as it does in the engine.
            shown = tokens[:-1] if finish == "stop" else tokens
            text, stop_at = self._text.add(shown)
        if stop_at is not None:
            tokens, logprobs, finish = tokens[:stop_at], logprobs[:stop_at], "stop"
            self._end_attempt(abort=True)
        elif finish and self._text is not None:
            text += self._text.finish()
        self.output_token_ids.extend(tokens)
        delta = Delta(tokens, text, logprobs_from_pb(logprobs) if logprobs else None, finish or None)
        if self._feed is not None and self._feed.prompt_logprobs:  # echo: once, with the first delta
            delta.prompt_logprobs, self._feed.prompt_logprobs = logprobs_from_pb(self._feed.prompt_logprobs), []
        if finish:
            self._end_attempt()
            self._finish(delta)
            await self._complete("ok")
        return delta if tokens or finish else None

    def _finish(self, delta: Delta) -> Delta:
        prompt_tokens = len(self.job.prompt_token_ids)
        self.usage = Usage(prompt_tokens, len(self.output_token_ids), min(self._cached_tokens or 0, prompt_tokens))
        self.finish_reason = delta.finish_reason
        self.status = "ok"
        self._done = True
        self._feed = None
        return delta

    # -- side calls ------------------------------------------------------------------------
    async def _complete(self, status: str) -> None:
        route, self._route = self._route, None
        if route is None and not self._routing:
            return
        self._routing = False
        with trace.use_span(self.span, end_on_exit=False):
            await self.backend.complete(self._schedulers[-1] if self._schedulers else "", self.job.request_id, status)


    def _time_left(self) -> float:
        left = self._deadline - asyncio.get_running_loop().time()
        if left <= 0:
            self._done = True
            raise ApiError(504, "The request timed out.", code="timeout")
        return left


class _FailedFeed:
    """Stands in for a stream whose worker gave the request up: the next read migrates it."""

    cached_tokens = None

    async def read(self) -> tuple:
        raise StreamFailed(grpc.StatusCode.ABORTED, "the decode worker aborted the request")


_FAILED = _FailedFeed()
