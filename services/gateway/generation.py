"""One request's way through the mesh: Scheduler.Route → DecodeWorker.Generate (stream) →
Scheduler.Complete, yielding `Delta`s.

When its decode worker fails mid-stream (UNAVAILABLE, cancelled by the peer, a dropped
connection, a stream that ends without a finish reason) it re-routes, excluding the failed
worker, and continues from prompt + the tokens generated so far with the remaining max_tokens,
so the client sees no lost or duplicated tokens.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc
from opentelemetry import trace

from kvmesh.runtime.pb import common_pb2, decode_pb2, scheduler_pb2
from kvmesh.runtime.telemetry import inject_metadata

from .errors import ApiError
from .wire import api_error_from_grpc, logprobs_from_pb, retry_after_from, sampling_pb
from .outputs import Delta, TokenLogprob, Usage
from .protocol import SamplingSpec

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
        self._call: grpc.aio.UnaryStreamCall | None = None
        self._attempt_tokens = 0  # tokens generated before the current attempt began
        self._emitted_text = ""
        self._carry_text = ""  # text the failed worker still held back, emitted with the next delta
        self._cached_tokens: int | None = None
        self._done = False

    @property
    def remaining_tokens(self) -> int:
        return self.job.max_tokens - len(self.output_token_ids)

    async def next(self) -> Delta | None:
        """The next delta; None once finished. Raises ApiError when the request cannot be served."""
        while not self._done:
            if self._call is None:
                await self._start_attempt()
            assert self._call is not None
            try:
                msg = await self._call.read()
            except grpc.aio.AioRpcError as exc:
                await self._fail(exc.code(), exc.details() or "", retry_after_from(exc.trailing_metadata()))
                continue
            if msg is grpc.aio.EOF:
                await self._fail(grpc.StatusCode.UNAVAILABLE, "the stream ended without a finish reason")
                continue
            if msg.finish_reason == "abort":
                # NOTE: we did not ask for it (a draining or failing worker did): keep its tokens, move on.
                self._call = _FinishedCall(None)
                msg.finish_reason = ""
                msg.ClearField("usage")
                if msg.token_ids:
                    return await self._consume(msg)
                continue
            return await self._consume(msg)
        return None

    async def close(self, aborted: bool = False) -> None:
        """Ends the request. When it is unfinished (client gone, or the caller gave up) the stream
        is cancelled and the worker asked to abort; the scheduler's slot is always released.
        Idempotent."""
        self._done = True
        route = self._route
        if route is None and not self._routing:
            return
        self.status = "aborted" if aborted else "error"
        if self._call is not None:
            self._call.cancel()
            self._call = None
        if route is not None:
            await self._abort_on_worker(route.decode.endpoint)
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
            try:
                route = await backend.scheduler().Route(route_req, timeout=timeout, metadata=self._metadata())
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
            stub = backend.decode(route.decode.endpoint)
            self._call = stub.Generate(gen_req, timeout=self._time_left(), metadata=self._metadata())
        self._attempt_tokens = len(self.output_token_ids)
        self.span.add_event("routed", {"kvmesh.decode": route.decode.worker_id, "kvmesh.attempt": self.migrations})

    async def _fail(self, code: grpc.StatusCode, details: str, retry_after_s: float | None = None) -> None:
        """The current attempt failed: migrate to another worker, or raise when that is not possible."""
        route = self._route
        self._call = None
        self.status = "error"
        await self._complete("error")
        failed = route.decode.worker_id if route is not None else ""
        log.warning("request %s: decode worker %s failed (%s: %s)", self.job.request_id, failed, code.name, details)
        if code not in MIGRATABLE:
            self._done = True
            raise api_error_from_grpc(code, details, retry_after_s)
        self._carry_text = self._held_back_text()
        if self._finish_without_worker():
            return
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

    def _finish_without_worker(self) -> bool:
        """Whether the tokens already streamed end the request (its finish message was lost)."""
        out = self.output_token_ids
        if not out:
            return False
        sampling = self.job.sampling
        if out[-1] in sampling.stop_token_ids or (not sampling.ignore_eos and out[-1] in self.backend.eos_token_ids):
            reason = "stop"
        elif self.remaining_tokens <= 0:
            reason = "length"
        else:
            return False
        self._call = _FinishedCall(Delta(finish_reason=reason))
        self.status = "ok"
        return True

    def _held_back_text(self) -> str:
        if self.backend.detokenize is None or not self.output_token_ids:
            return ""
        full = self.backend.detokenize(self.output_token_ids)
        return full[len(self._emitted_text) :] if full.startswith(self._emitted_text) else ""

    async def _consume(self, msg: decode_pb2.GenerateResponse | Delta) -> Delta:
        attempt_completion: int | None = None
        if isinstance(msg, Delta):  # a finish synthesized after a worker failure
            delta = msg
        else:
            delta = Delta(list(msg.token_ids), msg.text, logprobs_from_pb(msg.logprobs), msg.finish_reason or None,
                          logprobs_from_pb(msg.prompt_logprobs))
            if msg.HasField("usage"):
                if self._cached_tokens is None:
                    self._cached_tokens = msg.usage.cached_tokens
                attempt_completion = self._attempt_tokens + msg.usage.completion_tokens
        if self._carry_text and (delta.text or delta.finish_reason):
            delta.text, self._carry_text = self._carry_text + delta.text, ""
        self.output_token_ids.extend(delta.token_ids)
        self._emitted_text += delta.text
        if delta.finish_reason:
            prompt_tokens = len(self.job.prompt_token_ids)
            completion = max(len(self.output_token_ids), attempt_completion or 0)
            self.usage = Usage(prompt_tokens, completion, min(self._cached_tokens or 0, prompt_tokens))
            self.finish_reason = delta.finish_reason
            self.status = "ok"
            self._done = True
            self._call = None
            await self._complete("ok")
        return delta

    # -- side calls ------------------------------------------------------------------------
    async def _complete(self, status: str) -> None:
        route, self._route = self._route, None
        if route is None and not self._routing:
            return
        self._routing = False
        with trace.use_span(self.span, end_on_exit=False):
            try:
                await self.backend.scheduler().Complete(
                    scheduler_pb2.CompleteRequest(request_id=self.job.request_id, status=status),
                    timeout=SIDE_CALL_TIMEOUT_S,
                    metadata=self._metadata(),
                )
            except grpc.aio.AioRpcError as exc:
                log.warning("Complete(%s) failed: %s", self.job.request_id, exc.code().name)

    async def _abort_on_worker(self, endpoint: str) -> None:
        with trace.use_span(self.span, end_on_exit=False):
            try:
                await self.backend.decode(endpoint).Abort(
                    decode_pb2.AbortRequest(request_id=self.job.request_id),
                    timeout=SIDE_CALL_TIMEOUT_S,
                    metadata=self._metadata(),
                )
            except grpc.aio.AioRpcError as exc:
                log.info("Abort(%s) on %s failed: %s", self.job.request_id, endpoint, exc.code().name)

    def _metadata(self) -> tuple[tuple[str, str], ...]:
        return (*inject_metadata(), ("x-request-id", self.job.request_id))

    def _time_left(self) -> float:
        left = self._deadline - asyncio.get_running_loop().time()
        if left <= 0:
            self._done = True
            raise ApiError(504, "The request timed out.", code="timeout")
        return left


class _FinishedCall:
    """Stands in for a stream that has at most a synthesized finish left, then ends (EOF)."""

    def __init__(self, delta: Delta | None) -> None:
        self._delta: Delta | None = delta

    async def read(self) -> Delta | object:
        delta, self._delta = self._delta, None
        return delta if delta is not None else grpc.aio.EOF

    def cancel(self) -> bool:
        return True
