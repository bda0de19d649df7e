"""The life of one completion request: validate → tokenize → route/generate → respond, with the
span, metrics, per-key limit and mirror record that go with it."""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from kvmesh.runtime.telemetry import CLIENT_REQUEST_ID_ATTRIBUTE, REQUEST_ID_ATTRIBUTE, extract_context, tracer

from .auth import KeyLimiter
from .backend import Backend
from .generation import Generation, GenerationJob
from .wire import sampling_pb
from .config import GatewaySettings
from .errors import ApiError, model_not_found
from .metrics import GatewayMetrics
from .mirror import MirrorTap, mirror_record
from .outputs import Delta, TokenLogprob
from .prompt import PreparedPrompt, ServedModel
from .protocol import Endpoint, GenerationRequest, Limits
from .validate import parse_chat, parse_completion, parse_json
from .responses import SSE_DONE, ResponseBuilder, sse, sse_error
from .streaming import ClientDisconnected, EventStreamResponse, race_disconnect

log = logging.getLogger(__name__)

CLIENT_CLOSED = 499  # nginx's "client closed request": what the metrics record for a client that left
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")
_PREFIX = {Endpoint.COMPLETIONS: "cmpl", Endpoint.CHAT: "chatcmpl"}
_ROUTE = {Endpoint.COMPLETIONS: "/v1/completions", Endpoint.CHAT: "/v1/chat/completions"}


@dataclass(frozen=True, slots=True)
class RequestIds:
    """`mesh` is made here and keys the request on every hop (admission, routing, aborts); `client`
    is the caller's X-Request-Id, kept for correlation only: echoed back, on the trace, in logs.

    NOTE: the client's id is never the mesh's key. Two clients may send the same one, and the
    scheduler treats a repeated key as a retry: it would free the other client's admission slot."""

    mesh: str
    client: str | None

    @property
    def echoed(self) -> str:
        """The X-Request-Id header of the response: the client's own id when it sent one."""
        return self.client or self.mesh


def request_ids(header: str | None, endpoint: Endpoint) -> RequestIds:
    """A fresh mesh id (`cmpl-...`, also the response's `id`) and the client's validated X-Request-Id."""
    mesh = f"{_PREFIX[endpoint]}-{uuid.uuid4().hex}"
    if header is None or header == "":
        return RequestIds(mesh, None)
    if not _REQUEST_ID.match(header):
        raise ApiError(400, "X-Request-Id must be 1-128 characters of letters, digits and . _ : -", "X-Request-Id")
    return RequestIds(mesh, header)


async def read_body(request: Request, limit: int) -> bytes:
    too_large = ApiError(413, f"Request body too large: at most {limit} bytes are accepted.", code="request_too_large")
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


class CompletionService:
    """Serves /v1/completions and /v1/chat/completions."""

    def __init__(
        self, settings: GatewaySettings, backend: Backend, model: ServedModel, metrics: GatewayMetrics, mirror: MirrorTap
    ) -> None:
        self.settings = settings
        self.backend = backend
        self.model = model
        self.metrics = metrics
        self.mirror = mirror
        self.limits = Limits(settings.max_stop_sequences, settings.max_stop_length)
        self.limiter = KeyLimiter(settings.max_concurrent_streams_per_key)

    def parse(self, endpoint: Endpoint, raw: bytes) -> GenerationRequest:
        data = parse_json(raw)
        parse = parse_chat if endpoint is Endpoint.CHAT else parse_completion
        request = parse(data, self.limits)
        if request.model != self.model.name:
            raise model_not_found(request.model)
        return request

    async def handle(self, request: Request, endpoint: Endpoint, api_key: str) -> Response:
        ids = request_ids(request.headers.get("x-request-id"), endpoint)
        request.state.request_id = ids.echoed
        run = RequestRun(self, ids, endpoint, request)
        try:
            req = self.parse(endpoint, await read_body(request, self.settings.max_body_bytes))
            session_id = request.headers.get("x-session-id") or (req.user if self.settings.session_from_user else "") or ""
            prepared = await asyncio.to_thread(self.model.prepare, req, self.settings.default_max_tokens)
            self.limiter.acquire(api_key)
            run.key = api_key
            generation = run.begin(req, prepared, session_id, ids.mesh)
            first = await race_disconnect(request.receive, generation.next())
            if req.stream:
                return EventStreamResponse(run.events(first), run.close_stream, {"X-Request-Id": ids.echoed})
            body = await race_disconnect(request.receive, run.collect(first))
        except ClientDisconnected:
            await run.finish(aborted=True)
            return Response(status_code=CLIENT_CLOSED)
        except BaseException as exc:
            await run.finish(error=exc)
            raise
        await run.finish()
        return JSONResponse(body, headers={"X-Request-Id": ids.echoed})


class RequestRun:
    """Per-request state: span, timings, the generation, and a `finish` that runs exactly once."""

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
        self.generation: Generation | None = None
        self.builder: ResponseBuilder | None = None
        self.error: BaseException | None = None
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None
        self._finished = False
        service.metrics.inflight.inc()

    def begin(self, req: GenerationRequest, prepared: PreparedPrompt, session_id: str, response_id: str) -> Generation:
        s = self.service
        self.request, self.prepared, self.session_id = req, prepared, session_id
        self.span.set_attributes(
            {
                "gen_ai.request.model": req.model,
                "gen_ai.request.max_tokens": prepared.max_tokens,
                "gen_ai.usage.input_tokens": len(prepared.token_ids),
                "kvmesh.session_id": session_id,
                "kvmesh.stream": req.stream,
            }
        )
        job = GenerationJob(
            self.request_id, session_id, s.model.name, prepared.token_ids, prepared.block_hashes, req.sampling, prepared.max_tokens
        )
        self.builder = ResponseBuilder(req, response_id, s.model.name, int(time.time()), s.model.token_text)
        self.generation = s.backend.start(job, self.span)
        return self.generation

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
        """The SSE stream: role chunk (chat), one chunk per delta, usage chunk, [DONE]."""
        assert self.builder is not None and self.generation is not None and self.request is not None
        role = self.builder.role_chunk()
        if role is not None:
            yield sse(role)
        delta = first
        while delta is not None:
            self.observe(delta)
            chunk = self.builder.chunk_bytes(delta)
            if chunk is not None:
                yield chunk
            try:
                delta = await self.generation.next()
            except ApiError as exc:
                self.error = exc
                yield sse_error(exc)
                yield SSE_DONE
                return
            except Exception as exc:  # noqa: BLE001 - the client gets an error event, not a cut stream
                log.exception("request %s (client id %s) failed mid-stream", self.request_id, self.client_request_id)
                self.error = exc
                yield sse_error(ApiError(500, f"Internal error: {type(exc).__name__}", code="internal_error"))
                yield SSE_DONE
                return
        if self.request.include_usage and self.generation.usage is not None:
            yield sse(self.builder.usage_chunk(self.generation.usage))
        yield SSE_DONE

    async def collect(self, first: Delta | None) -> dict[str, Any]:
        """The whole (non-streaming) response."""
        assert self.builder is not None and self.generation is not None
        texts: list[str] = []
        logprobs: list[TokenLogprob] = []
        delta = first
        while delta is not None:
            self.observe(delta)
            texts.append(delta.text)
            logprobs.extend(delta.logprobs or ())
            delta = await self.generation.next()
        usage = self.generation.usage
        assert usage is not None
        return self.builder.final("".join(texts), self.generation.finish_reason, logprobs, usage)

    async def close_stream(self, disconnected: bool) -> None:
        await self.finish(aborted=disconnected)

    async def finish(self, aborted: bool = False, error: BaseException | None = None) -> None:
        if self._finished:
            return
        self._finished = True
        self.error = self.error or error
        try:
            if self.generation is not None:
                await self.generation.close(aborted=aborted)
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
        completion = len(gen.output_token_ids) if gen is not None else 0
        if gen is not None and gen.usage is not None:
            completion = gen.usage.completion_tokens
        if self.prepared is not None:
            m.prompt_tokens.inc(len(self.prepared.token_ids))
            m.completion_tokens.inc(completion)
        self.span.set_attribute("gen_ai.usage.output_tokens", completion)
        if gen is not None:
            self.span.set_attribute("kvmesh.migrations", gen.migrations)
            if gen.finish_reason:
                self.span.set_attribute("gen_ai.response.finish_reasons", [gen.finish_reason])
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
            sampling_pb(self.request.sampling, self.prepared.max_tokens),
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
