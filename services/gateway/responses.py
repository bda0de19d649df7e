"""OpenAI response objects and SSE framing, built from `Delta`s (pure)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import orjson

from .errors import ApiError
from .outputs import Delta, TokenLogprob, Usage
from .protocol import Endpoint, GenerationRequest

SSE_DONE = b"data: [DONE]\n\n"
_MIN_LOGPROB = -9999.0  # NOTE: JSON has no -inf; vLLM clamps the same way


def sse(payload: dict[str, Any]) -> bytes:
    """One server-sent event: `data: {...}\\n\\n`."""
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def sse_error(error: ApiError) -> bytes:
    return sse(error.body())


def usage_dict(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }


def _lp(value: float) -> float:
    return value if math.isfinite(value) else _MIN_LOGPROB


class ResponseBuilder:
    """Builds the chunks and the final object of one request, completions or chat."""

    def __init__(
        self,
        request: GenerationRequest,
        response_id: str,
        model: str,
        created: int,
        token_text: Callable[[int], str],
    ) -> None:
        self.request = request
        self.id = response_id
        self.model = model
        self.created = created
        self._token_text = token_text
        self._chat = request.endpoint is Endpoint.CHAT
        self._text_offset = 0
        # NOTE: a text-only chunk is the common case: pre-encoded around its text, it costs one
        # string escape instead of a dict and a json.dumps (byte-for-byte what `chunk` gives).
        kind = b"chat.completion.chunk" if self._chat else b"text_completion"
        self._text_head = (
            b'data: {"id":' + orjson.dumps(response_id) + b',"object":"' + kind + b'","created":' + str(created).encode()
            + b',"model":' + orjson.dumps(model) + (b',"choices":[{"index":0,"delta":{"content":' if self._chat else b',"choices":[{"index":0,"text":')
        )
        self._text_tail = (b"}" if self._chat else b"") + b',"logprobs":null,"finish_reason":null}]' + (
            b',"usage":null}\n\n' if request.include_usage else b"}\n\n"
        )

    # -- streaming -------------------------------------------------------------------------
    def _chunk(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        chunk = {
            "id": self.id,
            "object": "chat.completion.chunk" if self._chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if self.request.include_usage:
            chunk["usage"] = None
        return chunk

    def role_chunk(self) -> dict[str, Any] | None:
        """The first chat chunk, announcing the assistant role; None for completions."""
        if not self._chat:
            return None
        return self._chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}])

    def chunk(self, delta: Delta) -> dict[str, Any] | None:
        """The chunk for one delta; None when it carries nothing a client can see."""
        wants_logprobs = self.request.sampling.logprobs is not None and delta.logprobs
        if not delta.text and not delta.finish_reason and not wants_logprobs:
            return None
        logprobs = self.logprobs(delta.logprobs) if wants_logprobs else None
        if self._chat:
            choice = {"index": 0, "delta": {"content": delta.text} if delta.text else {}}
        else:
            choice = {"index": 0, "text": delta.text}
        choice |= {"logprobs": logprobs, "finish_reason": delta.finish_reason}
        return self._chunk([choice])

    def chunk_bytes(self, delta: Delta) -> bytes | None:
        """The SSE event for one delta; None when it carries nothing a client can see."""
        if delta.text and delta.finish_reason is None and (self.request.sampling.logprobs is None or not delta.logprobs):
            return self._text_head + orjson.dumps(delta.text) + self._text_tail
        chunk = self.chunk(delta)
        return sse(chunk) if chunk is not None else None

    def usage_chunk(self, usage: Usage) -> dict[str, Any]:
        """The last chunk with `stream_options.include_usage`: empty choices, the usage."""
        chunk = self._chunk([])
        chunk["usage"] = usage_dict(usage)
        return chunk

    # -- whole response --------------------------------------------------------------------
    def final(self, text: str, finish_reason: str | None, logprobs: list[TokenLogprob] | None, usage: Usage) -> dict[str, Any]:
        lp = self.logprobs(logprobs) if self.request.sampling.logprobs is not None else None
        if self._chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": lp, "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": text, "logprobs": lp, "finish_reason": finish_reason}
        return {
            "id": self.id,
            "object": "chat.completion" if self._chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": usage_dict(usage),
        }

    # -- logprobs --------------------------------------------------------------------------
    def logprobs(self, entries: list[TokenLogprob] | None) -> dict[str, Any]:
        entries = entries or []
        if self._chat:
            return {"content": [self._chat_logprob(e) for e in entries]}
        tokens, offsets = [], []
        for e in entries:
            token = self._token_text(e.token_id)
            tokens.append(token)
            offsets.append(self._text_offset)
            self._text_offset += len(token)
        return {
            "tokens": tokens,
            "token_logprobs": [_lp(e.logprob) for e in entries],
            "top_logprobs": [{self._token_text(t): _lp(v) for t, v in e.top} for e in entries],
            "text_offset": offsets,
        }

    def _chat_logprob(self, entry: TokenLogprob) -> dict[str, Any]:
        token = self._token_text(entry.token_id)
        return {
            "token": token,
            "logprob": _lp(entry.logprob),
            "bytes": list(token.encode()),
            "top_logprobs": [
                {"token": (t := self._token_text(tid)), "logprob": _lp(v), "bytes": list(t.encode())} for tid, v in entry.top
            ],
        }
