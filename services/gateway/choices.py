"""One choice of a response (pure): its index, tool calls, echo and prompt logprobs.

`ChoiceShaper` sits between a choice's `Delta`s and the `ResponseBuilder`: it sets the choice's
`index` (n > 1), passes text through the `ToolCallStream` when tools are on (so `delta.content`
carries text and `delta.tool_calls` the calls, with `finish_reason` "tool_calls"), and for
completions with `echo` puts the prompt's text (and, with `logprobs`, its token logprobs, the
first token's being null) before the output.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from .outputs import Delta, TokenLogprob, Usage
from .protocol import Endpoint, GenerationRequest, ToolChoice
from .responses import ResponseBuilder, sse
from .toolparsers import ToolCall
from .toolstream import ToolCallStream


class ChoiceShaper:
    def __init__(
        self,
        index: int,
        request: GenerationRequest,
        builder: ResponseBuilder,
        tools: ToolCallStream | None,
        prompt_token_ids: list[int],
        detokenize: Callable[[list[int]], str],
    ) -> None:
        self.index = index
        self.request = request
        self.builder = builder
        self.tools = tools if request.endpoint is Endpoint.CHAT and request.tool_choice is not ToolChoice.NONE else None
        self.prompt_token_ids = prompt_token_ids
        self.detokenize = detokenize
        self.texts: list[str] = []
        self.logprobs: list[TokenLogprob] = []
        self.prompt_logprobs: list[TokenLogprob] | None = None
        self._echo_sent = False

    # -- streaming -----------------------------------------------------------------------
    def role_chunk(self) -> dict[str, Any] | None:
        return self._indexed(self.builder.role_chunk())

    def events(self, delta: Delta) -> list[bytes]:
        """The SSE events for one delta (the builder's fast path for a plain single choice)."""
        if self.index == 0 and self.tools is None and not self.request.echo:
            event = self.builder.chunk_bytes(delta)
            return [event] if event is not None else []
        return [sse(chunk) for chunk in self.chunks(delta)]

    def chunks(self, delta: Delta) -> list[dict[str, Any]]:
        """The chunks for one delta, in order (possibly none)."""
        out: list[dict[str, Any]] = []
        echo = self._echo_chunk(delta)
        if echo is not None:
            out.append(echo)
        if self.tools is None:
            chunk = self.builder.chunk(delta)
            return out + ([self._indexed(chunk)] if chunk is not None else [])
        content = self.tools.push(delta.text)
        if delta.finish_reason is None:
            chunk = self.builder.chunk(replace(delta, text=content))
            return out + ([self._indexed(chunk)] if chunk is not None else [])
        rest, calls = self.tools.finish()
        text = content + rest
        if text:
            out.append(self._indexed(self.builder.chunk(replace(delta, text=text, finish_reason=None))))
        for i, call in enumerate(calls):
            chunk = self.builder.chunk(Delta(finish_reason="stop"))  # a choice dict to fill in
            chunk["choices"][0] |= {"delta": {"tool_calls": [_call_delta(i, call)]}, "finish_reason": None, "logprobs": None}
            out.append(self._indexed(chunk))
        last = self.builder.chunk(Delta(finish_reason=self._finish_reason(delta.finish_reason, calls)))
        last["choices"][0]["delta"] = {}
        return out + [self._indexed(last)]

    def _echo_chunk(self, delta: Delta) -> dict[str, Any] | None:
        if not self.request.echo or self._echo_sent:
            return None
        self._echo_sent = True
        self.prompt_logprobs = delta.prompt_logprobs
        chunk = self.builder.chunk(Delta(text=self.detokenize(self.prompt_token_ids)))
        if chunk is not None and self.request.sampling.logprobs is not None:
            chunk["choices"][0]["logprobs"] = self._prompt_logprobs_dict()
        return self._indexed(chunk)

    # -- whole response ------------------------------------------------------------------
    def add(self, delta: Delta) -> None:
        if delta.prompt_logprobs is not None:
            self.prompt_logprobs = delta.prompt_logprobs
        self.texts.append(delta.text)
        self.logprobs.extend(delta.logprobs or ())

    def final_choice(self, finish_reason: str | None, usage: Usage) -> dict[str, Any]:
        text = "".join(self.texts)
        calls: tuple[ToolCall, ...] = ()
        if self.tools is not None:
            parsed = self.tools.parse(text)
            text, calls = parsed.content or "", parsed.tool_calls
        prompt: dict[str, Any] | None = None
        if self.request.echo:
            text = self.detokenize(self.prompt_token_ids) + text
            if self.request.sampling.logprobs is not None:
                prompt = self._prompt_logprobs_dict()  # NOTE: first, so text offsets run prompt → output
        choice = self.builder.final(text, finish_reason, self.logprobs, usage)["choices"][0]
        if prompt is not None:
            out = choice["logprobs"]
            choice["logprobs"] = {k: prompt[k] + out[k] for k in prompt}
        if calls:
            choice["message"] = {"role": "assistant", "content": text or None, "tool_calls": [c.as_dict() for c in calls]}
            choice["finish_reason"] = self._finish_reason(finish_reason, calls)
        choice["index"] = self.index
        return choice

    # -- helpers -------------------------------------------------------------------------
    def _prompt_logprobs_dict(self) -> dict[str, Any]:
        """Completions-style logprobs of the prompt: the first token's logprob is null."""
        ids = self.prompt_token_ids
        entries = [TokenLogprob(ids[0], float("nan"))] + list(self.prompt_logprobs or ())
        lp = self.builder.logprobs(entries)
        lp["token_logprobs"][0] = None
        lp["top_logprobs"][0] = None
        return lp

    def _finish_reason(self, reason: str | None, calls: tuple[ToolCall, ...]) -> str | None:
        return "tool_calls" if calls and reason != "length" else reason

    def _indexed(self, chunk: dict[str, Any] | None) -> dict[str, Any] | None:
        if chunk is not None:
            for choice in chunk["choices"]:
                choice["index"] = self.index
        return chunk


def _call_delta(i: int, call: ToolCall) -> dict[str, Any]:
    return {"index": i, "id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


def merge_usage(usages: list[Usage]) -> Usage:
    """One prompt, n completions: the prompt counted once, the completions summed."""
    first = usages[0]
    return Usage(first.prompt_tokens, sum(u.completion_tokens for u in usages), first.cached_tokens)
