"""One request's run: span, timings, its choices' generations, and a `finish` that runs once.

With `n` > 1 every choice is its own generation (request id `<id>-<i>`, seed `seed + i` as vLLM
does). Choices 1..n-1 start once choice 0 has its first token: by then the decode worker holds
the prompt's KV in its prefix cache, and sharing one session id keeps them on that worker, so
the prompt is prefilled once and its full blocks are shared, not recomputed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from starlette.requests import Request

from kvmesh.runtime.telemetry import CLIENT_REQUEST_ID_ATTRIBUTE, REQUEST_ID_ATTRIBUTE, extract_context, tracer

from .choices import ChoiceShaper, merge_usage
from .errors import ApiError
from .generation import Generation, GenerationJob
from .mirror import mirror_record
from .outputs import Delta
from .prompt import PreparedPrompt
from .protocol import Endpoint, GenerationRequest
from .responses import SSE_DONE, ResponseBuilder, sse, sse_error
from .toolstream import ToolCallStream
from .wire import sampling_pb

if TYPE_CHECKING:
    from .handlers import CompletionService, RequestIds

log = logging.getLogger(__name__)

_ROUTE = {Endpoint.COMPLETIONS: "/v1/completions", Endpoint.CHAT: "/v1/chat/completions"}


class ChoiceRun:
    __slots__ = ("generation", "shaper")

    def __init__(self, generation: Generation, shaper: ChoiceShaper) -> None:
        self.generation = generation
        self.shaper = shaper


class RequestRun:
    """Per-request state: span, timings, the choices, and a `finish` that runs exactly once."""

    def __init__(self, service: CompletionService, ids: RequestIds, endpoint: Endpoint, request: Request) -> None:
        self.service = service
        self.request_id = ids.mesh
        self.client_request_id = ids.client
        self.started = time.monotonic()
        self.span = tracer.start_span(
            "gateway.request",
            context=extract_context(request.headers),  # the client's W3C traceparent, if any
            attributes={REQUEST_ID_ATTRIBUTE: ids.mesh, "http.route": _ROUTE[endpoint],
                        **({CLIENT_REQUEST_ID_ATTRIBUTE: ids.client} if ids.client else {})},
        )
        self.key: str | None = None
        self.request: GenerationRequest | None = None
        self.prepared: PreparedPrompt | None = None
        self.session_id = ""
        self.response_id = ""
        self.created = int(time.time())
        self.choices: list[ChoiceRun] = []
        self.error: BaseException | None = None
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None
        self._finished = False
        service.metrics.inflight.inc()

    @property
    def generation(self) -> Generation | None:
        """Choice 0's generation (what the mirror record and migrations describe)."""
        return self.choices[0].generation if self.choices else None

    def begin(self, req: GenerationRequest, prepared: PreparedPrompt, session_id: str, response_id: str) -> Generation:
        self.request, self.prepared, self.response_id = req, prepared, response_id
        # NOTE: the choices of one request share a session, so sticky routing keeps them together.
        self.session_id = session_id or (self.request_id if req.n > 1 else "")
        self.span.set_attributes(
            {
                "gen_ai.request.model": req.model,
                "gen_ai.request.max_tokens": prepared.max_tokens,
                "gen_ai.request.choice.count": req.n,
                "gen_ai.usage.input_tokens": len(prepared.token_ids),
                "kvmesh.session_id": self.session_id,
                "kvmesh.stream": req.stream,
                "kvmesh.priority": req.priority,
            }
        )
        self.choices = [self._choice(0)]
        return self.choices[0].generation

    def start_rest(self) -> None:
        """Start choices 1..n-1 (after choice 0's first token: its prompt KV is cached by then)."""
        assert self.request is not None
        self.choices += [self._choice(i) for i in range(len(self.choices), self.request.n)]

    def _choice(self, i: int) -> ChoiceRun:
        s, req, prepared = self.service, self.request, self.prepared
        assert req is not None and prepared is not None
        sampling = req.sampling
        if i and sampling.seed is not None:
            sampling = replace(sampling, seed=sampling.seed + i)
        job = GenerationJob(
            self.request_id if i == 0 else f"{self.request_id}-{i}", self.session_id, s.model.name, prepared.token_ids,
            prepared.block_hashes, sampling, prepared.max_tokens, req.priority,
        )
        builder = ResponseBuilder(req, self.response_id, s.model.name, self.created, s.model.token_text)
        tools = ToolCallStream(s.tool_parser, req.tool_choice, req.tool_name) if req.tools else None
        shaper = ChoiceShaper(i, req, builder, tools, prepared.token_ids, self._prompt_text)
        return ChoiceRun(s.backend.start(job, self.span), shaper)

    def _prompt_text(self, token_ids: list[int]) -> str:
        req = self.request
        return req.prompt if req is not None and req.prompt is not None else self.service.model.tokenizer.decode(token_ids)

    def observe(self, delta: Delta) -> None:
        if not delta.token_ids:
            return
        now = time.monotonic()
        if self.first_token_at is None:
            self.first_token_at = now
            self.service.metrics.ttft.observe(now - self.started)
        else:
            self.service.metrics.inter_token.observe(now - (self.last_token_at or now))
        self.last_token_at = now

    async def events(self, first: Delta | None) -> AsyncIterator[bytes]:
        """The SSE stream: role chunks (chat), the choices' chunks as they come, usage, [DONE].

        One write (one event of this iterator) per delta, and fewer where nothing comes between:
        the role chunks go with the first delta's chunks (that delta is in hand before the stream
        starts), and a single choice's last delta (it has a finish_reason) with the usage chunk and
        [DONE], which follow it at once. Each write cost the gateway ~13 µs of loopback send and
        the client a wakeup; two of ~36 a request at bench/tokcost.py's load."""
        assert self.request is not None
        held = b"".join(sse(role) for role in (c.shaper.role_chunk() for c in self.choices) if role is not None)
        if held and first is None:
            yield held
            held = b""
        single = len(self.choices) == 1
        items = self._single(first) if single else self._merged(first)
        try:
            async for i, item in items:
                if isinstance(item, BaseException):
                    yield held + self._error_event(item) + SSE_DONE
                    return
                self.observe(item)
                events = self.choices[i].shaper.events(item)
                if not events and not held:
                    continue
                chunk = held + (events[0] if len(events) == 1 else b"".join(events))  # NOTE: one send per delta
                if single and item.finish_reason is not None:
                    held = chunk  # the stream's end follows at once: one write for both
                else:
                    held = b""
                    yield chunk
        finally:
            await items.aclose()
        usages = [c.generation.usage for c in self.choices]
        if self.request.include_usage and all(u is not None for u in usages):
            yield held + sse(self.choices[0].shaper.builder.usage_chunk(merge_usage(usages))) + SSE_DONE  # type: ignore[arg-type]
        else:
            yield held + SSE_DONE

    def _error_event(self, error: BaseException) -> bytes:
        self.error = error
        if not isinstance(error, ApiError):
            log.error("request %s (client id %s) failed mid-stream", self.request_id, self.client_request_id, exc_info=error)
            error = ApiError(500, f"Internal error: {type(error).__name__}", code="internal_error")
        return sse_error(error)

    async def _single(self, first: Delta | None) -> AsyncIterator[tuple[int, Delta | BaseException]]:
        """One choice's deltas, read in place (no task and queue per delta); a failure ends it."""
        generation = self.choices[0].generation
        try:
            delta = first if first is not None else await generation.next()
            while delta is not None:
                yield 0, delta
                delta = await generation.next()
        except Exception as exc:  # noqa: BLE001 - handed to the stream, which ends with an error event
            yield 0, exc

    async def _merged(self, first: Delta | None) -> AsyncIterator[tuple[int, Delta | BaseException]]:
        """Every choice's deltas as they come (one pump task per choice); a failure ends it."""
        queue: asyncio.Queue[tuple[int, Delta | BaseException | None]] = asyncio.Queue()
        pumps = [asyncio.ensure_future(self._pump(i, c, first if i == 0 else None, queue)) for i, c in enumerate(self.choices)]
        try:
            left = len(pumps)
            while left:
                i, item = await queue.get()
                if item is None:
                    left -= 1
                    continue
                yield i, item
                if isinstance(item, BaseException):
                    return
        finally:
            for p in pumps:
                p.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)

    @staticmethod
    async def _pump(i: int, choice: ChoiceRun, first: Delta | None, queue: asyncio.Queue) -> None:
        try:
            delta = first if first is not None else await choice.generation.next()
            while delta is not None:
                queue.put_nowait((i, delta))
                delta = await choice.generation.next()
            queue.put_nowait((i, None))
        except Exception as exc:  # noqa: BLE001 - handed to the stream, which ends with an error event
            queue.put_nowait((i, exc))

    async def collect(self, first: Delta | None) -> dict[str, Any]:
        """The whole (non-streaming) response."""

        async def one(i: int, c: ChoiceRun) -> None:
            delta = first if i == 0 else await c.generation.next()
            while delta is not None:
                self.observe(delta)
                c.shaper.add(delta)
                delta = await c.generation.next()

        await asyncio.gather(*(one(i, c) for i, c in enumerate(self.choices)))
        usages = [c.generation.usage for c in self.choices]
        assert all(u is not None for u in usages)
        choices = [c.shaper.final_choice(c.generation.finish_reason, u) for c, u in zip(self.choices, usages)]  # type: ignore[arg-type]
        body = self.choices[0].shaper.builder.final("", None, [], merge_usage(usages))  # type: ignore[arg-type]
        body["choices"] = choices
        return body

    async def close_stream(self, disconnected: bool) -> None:
        """The event stream's `on_close`: what the request still owes downstream (a worker's abort,
        the scheduler's Complete) is shielded from a cancel of the request's task; a request that
        owes nothing (every choice finished: the usual end) ends in place, with no task for a shield."""
        if not disconnected and all(c.generation.settled for c in self.choices):
            await self.finish()  # NOTE: does not suspend: nothing in it awaits anything that waits
        else:
            await asyncio.shield(self.finish(aborted=disconnected))

    async def finish(self, aborted: bool = False, error: BaseException | None = None) -> None:
        if self._finished:
            return
        self._finished = True
        self.error = self.error or error
        try:
            closing = [c.generation.close(aborted=aborted) for c in self.choices]
            await (closing[0] if len(closing) == 1 else asyncio.gather(*closing))  # NOTE: one choice: no task
        finally:
            self._record(aborted)

    def _record(self, aborted: bool) -> None:
        s, m, gen = self.service, self.service.metrics, self.generation
        end = time.monotonic()
        m.inflight.dec()
        if self.key is not None:
            s.limiter.release(self.key)
        m.e2e.observe(end - self.started)
        tpot = self._tpot()
        if tpot is not None:
            m.tpot.observe(tpot)
        completion = sum(c.generation.usage.completion_tokens if c.generation.usage is not None
                         else len(c.generation.output_token_ids) for c in self.choices)
        if self.prepared is not None:
            m.prompt_tokens.inc(len(self.prepared.token_ids))
            m.completion_tokens.inc(completion)
        self.span.set_attribute("gen_ai.usage.output_tokens", completion)
        if gen is not None:
            self.span.set_attribute("kvmesh.migrations", gen.migrations)
            reasons = [c.generation.finish_reason for c in self.choices if c.generation.finish_reason]
            if reasons:
                self.span.set_attribute("gen_ai.response.finish_reasons", reasons)
        error = "aborted" if aborted else _error_text(self.error)
        if error:
            self.span.set_status(trace.Status(trace.StatusCode.ERROR, error))
        self.span.end()
        if gen is not None and self.prepared is not None:
            s.mirror.offer(lambda: self._mirror_record(gen, error, tpot))

    def _tpot(self) -> float | None:
        gen = self.generation
        if gen is None or self.first_token_at is None or self.last_token_at is None or len(gen.output_token_ids) < 2:
            return None
        return (self.last_token_at - self.first_token_at) / (len(gen.output_token_ids) - 1)

    def _mirror_record(self, gen: Generation, error: str, tpot: float | None) -> Any:
        assert self.prepared is not None and self.request is not None
        ttft = (self.first_token_at - self.started) if self.first_token_at is not None else 0.0
        return mirror_record(
            self.request_id,
            self.service.model.name,
            self.session_id,
            self.prepared.token_ids,
            sampling_pb(self.request.sampling, self.prepared.max_tokens, self.request.priority),
            gen.output_token_ids,
            gen.finish_reason or "",
            ttft,
            tpot or 0.0,
            error,
            pool=gen.pool,
        )


def _error_text(error: BaseException | None) -> str:
    if error is None:
        return ""
    if isinstance(error, ApiError):
        return f"{error.status}: {error.message}"
    if isinstance(error, asyncio.CancelledError):
        return "cancelled"
    return f"{type(error).__name__}: {error}"
