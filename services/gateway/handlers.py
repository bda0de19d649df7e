"""The life of one completion request: validate → tokenize → route/generate → respond, with the
span, metrics, per-key limit and mirror record that go with it."""

from __future__ import annotations

import asyncio
import logging
import re
import uuid
from dataclasses import dataclass, replace

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .auth import KeyLimiter
from .backend import Backend
from .config import GatewaySettings
from .errors import ApiError, model_not_found
from .metrics import GatewayMetrics
from .mirror import MirrorTap
from .prompt import PreparedPrompt, ServedModel
from .protocol import Endpoint, GenerationRequest, Limits
from .requestrun import RequestRun
from .responses import SSE_DONE
from .streaming import ClientDisconnected, DisconnectWatch, EventStreamResponse
from .toolparsers import parser_for
from .validate import INT32_MAX, INT32_MIN, parse_chat, parse_completion, parse_json

log = logging.getLogger(__name__)

CLIENT_CLOSED = 499  # nginx's "client closed request": what the metrics record for a client that left
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")
_PREFIX = {Endpoint.COMPLETIONS: "cmpl", Endpoint.CHAT: "chatcmpl"}
# NOTE: a body this small is tokenized on the event loop (~35 µs for a short chat turn); a hop to
# a thread costs ~100 µs of CPU more than that. Larger bodies go to a thread, so that a long
# prompt's template and tokenizer never hold up the other streams.
INLINE_PREPARE_BYTES = 2048
# NOTE: a prompt of token ids has no tokenizer work: preparing it checks the ids and hashes its
# blocks, ~90 µs per 1,000 ids, on the loop either way (the GIL). Its body is ~4.4 bytes an id,
# so the byte rule sent every prompt past ~460 ids to a thread: on a 1-worker mesh under the
# fidelity trace (~1,000-id prompts, 8 and 22 req/s) the gateway's span start to prepared took
# 0.95 ms at the median, 0.51-0.71 inline. Up to this many ids it runs inline (~0.7 ms at most).
INLINE_PREPARE_TOKEN_IDS = 8192


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
        self.tool_parser = parser_for(settings.tool_call_parser, model.tokenizer.chat_template)

    def parse(self, endpoint: Endpoint, raw: bytes, priority_header: str | None = None) -> GenerationRequest:
        data = parse_json(raw)
        parse = parse_chat if endpoint is Endpoint.CHAT else parse_completion
        request = parse(data, self.limits)
        if request.model != self.model.name:
            raise model_not_found(request.model)
        if priority_header is not None and data.get("priority") is None:
            request = replace(request, priority=header_priority(priority_header))
        return request

    async def handle(self, request: Request, endpoint: Endpoint, api_key: str) -> Response:
        ids = request_ids(request.headers.get("x-request-id"), endpoint)
        request.state.request_id = ids.echoed
        run = RequestRun(self, ids, endpoint, request)
        watch: DisconnectWatch | None = DisconnectWatch(request.receive)  # the stream's, once it has one
        try:
            raw = await read_body(request, self.settings.max_body_bytes)
            req = self.parse(endpoint, raw, request.headers.get("x-request-priority"))
            session_id = request.headers.get("x-session-id") or (req.user if self.settings.session_from_user else "") or ""
            prepared = await prepare(self.model, req, self.settings.default_max_tokens, len(raw))
            self.limiter.acquire(api_key)
            run.key = api_key
            generation = run.begin(req, prepared, session_id, ids.mesh)
            first = await watch.race(generation.next())
            run.start_rest()
            if req.stream:
                stream, watch = watch, None
                return EventStreamResponse(run.events(first), run.close_stream, {"X-Request-Id": ids.echoed}, last=SSE_DONE,
                                           watch=stream)
            body = await watch.race(run.collect(first))
        except ClientDisconnected:
            await run.finish(aborted=True)
            return Response(status_code=CLIENT_CLOSED)
        except BaseException as exc:
            await run.finish(error=exc)
            raise
        finally:
            if watch is not None:
                watch.close()
        await run.finish()
        return JSONResponse(body, headers={"X-Request-Id": ids.echoed})


async def prepare(model: ServedModel, req: GenerationRequest, default_max_tokens: int, body_bytes: int) -> PreparedPrompt:
    """`model.prepare` inline for a small body or a prompt of token ids up to INLINE_PREPARE_TOKEN_IDS,
    on a thread for text to tokenize in a larger body (INLINE_PREPARE_BYTES) or more ids."""
    ids = req.prompt_token_ids
    if (body_bytes <= INLINE_PREPARE_BYTES) if ids is None else (len(ids) <= INLINE_PREPARE_TOKEN_IDS):
        return model.prepare(req, default_max_tokens)
    return await asyncio.to_thread(model.prepare, req, default_max_tokens)


def header_priority(value: str) -> int:
    """The X-Request-Priority header: a signed 32-bit integer, lower runs first (like `priority`)."""
    try:
        priority = int(value.strip())
    except ValueError:
        raise ApiError(400, f"X-Request-Priority must be an integer, got {value!r}.", "X-Request-Priority") from None
    if not INT32_MIN <= priority <= INT32_MAX:
        raise ApiError(400, f"X-Request-Priority must fit in a signed 32-bit integer, got {priority}.", "X-Request-Priority")
    return priority
