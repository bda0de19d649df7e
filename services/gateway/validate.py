"""Validation of OpenAI request bodies into a `GenerationRequest` (pure).

Every input a user can get wrong ends in an `ApiError(400)` that names the offending parameter;
fields that would change the meaning of a request and that this server does not implement
(`tools`, `response_format` json, `best_of`, `echo`, `suffix`, penalties, ...) are refused by name
rather than silently ignored.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from .errors import ApiError, invalid
from .protocol import (
    ChatBody,
    ChatMessage,
    CompletionBody,
    Endpoint,
    GenerationRequest,
    Limits,
    SamplingSpec,
    Body,
    CommonBody,
)

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
INT32_MAX = 2**31 - 1
MAX_LOGPROBS = 20


def parse_json(raw: bytes) -> Any:
    """The JSON object of a request body, or a 400 that says why it is not one."""
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise invalid(f"We could not parse the JSON body of your request: {exc}", code="invalid_json") from exc
    if not isinstance(data, dict):
        raise invalid("The request body must be a JSON object.", code="invalid_json")
    return data


def parse_completion(data: dict[str, Any], limits: Limits) -> GenerationRequest:
    body = _validate(CompletionBody, data)
    _refuse_common(body)
    if body.best_of not in (None, 1):
        raise invalid(f"best_of={body.best_of} is not supported; only best_of=1.", "best_of", "unsupported_parameter")
    if body.echo:
        raise invalid("echo=true is not supported.", "echo", "unsupported_parameter")
    if body.suffix:
        raise invalid("suffix is not supported.", "suffix", "unsupported_parameter")
    logprobs = body.logprobs
    if logprobs is not None and not 0 <= logprobs <= MAX_LOGPROBS:
        raise invalid(f"logprobs must be between 0 and {MAX_LOGPROBS}, got {logprobs}.", "logprobs")
    prompt, token_ids = _prompt(body.prompt)
    return GenerationRequest(
        endpoint=Endpoint.COMPLETIONS,
        model=body.model,
        sampling=_sampling(body, limits, logprobs),
        max_tokens=_max_tokens(body.max_tokens, "max_tokens"),
        stream=bool(body.stream),
        include_usage=_include_usage(body),
        user=body.user,
        prompt=prompt,
        prompt_token_ids=token_ids,
    )


def parse_chat(data: dict[str, Any], limits: Limits) -> GenerationRequest:
    body = _validate(ChatBody, data)
    _refuse_common(body)
    if body.tools:
        raise invalid("tools are not supported by this server.", "tools", "unsupported_parameter")
    if body.tool_choice not in (None, "none"):
        raise invalid("tool_choice is not supported by this server.", "tool_choice", "unsupported_parameter")
    if body.functions or body.function_call is not None:
        param = "functions" if body.functions else "function_call"
        raise invalid(f"{param} is not supported by this server.", param, "unsupported_parameter")
    kind = (body.response_format or {}).get("type", "text")
    if kind != "text":
        raise invalid(f"response_format type {kind!r} is not supported; only 'text'.", "response_format", "unsupported_parameter")
    logprobs = None
    if body.top_logprobs is not None:
        if not body.logprobs:
            raise invalid("top_logprobs requires logprobs to be true.", "top_logprobs")
        if not 0 <= body.top_logprobs <= MAX_LOGPROBS:
            raise invalid(f"top_logprobs must be between 0 and {MAX_LOGPROBS}, got {body.top_logprobs}.", "top_logprobs")
    if body.logprobs:
        logprobs = body.top_logprobs or 0
    if body.max_completion_tokens is not None:
        max_tokens, param = _max_tokens(body.max_completion_tokens, "max_completion_tokens"), "max_completion_tokens"
    else:
        max_tokens, param = _max_tokens(body.max_tokens, "max_tokens"), "max_tokens"
    return GenerationRequest(
        endpoint=Endpoint.CHAT,
        model=body.model,
        sampling=_sampling(body, limits, logprobs),
        max_tokens=max_tokens,
        stream=bool(body.stream),
        include_usage=_include_usage(body),
        user=body.user,
        messages=_messages(body.messages),
        max_tokens_param=param,
    )


def _validate(model: type[Body], data: dict[str, Any]) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise _validation_error(exc, data) from None


def _validation_error(exc: ValidationError, data: dict[str, Any]) -> ApiError:
    errors = exc.errors(include_url=False)
    first = errors[0]
    missing = first["type"] == "missing"
    param = _param(first["loc"], data, missing)
    if missing:
        return invalid(f"Missing required parameter: '{param}'.", param, "missing_required_parameter")
    same = [e for e in errors if _param(e["loc"], data, False) == param]
    if len(same) > 1:  # a union: every alternative failed
        return invalid(f"Invalid type for '{param}': got {_json_type(same[0]['input'])}.", param, "invalid_type")
    return invalid(f"Invalid value for '{param}': {first['msg']}.", param, "invalid_value")


def _param(loc: tuple[Any, ...], data: Any, missing: bool) -> str:
    """The dotted path of `loc` as far as it exists in the input (OpenAI style: messages.[0].role);
    union member tags that pydantic adds to `loc` are not part of it."""
    parts: list[str] = []
    node = data
    for i, key in enumerate(loc):
        if isinstance(node, dict) and isinstance(key, str) and (key in node or (missing and i == len(loc) - 1)):
            parts.append(key)
            node = node.get(key)
        elif isinstance(node, list) and isinstance(key, int) and key < len(node):
            parts.append(f"[{key}]")
            node = node[key]
        else:
            break
    return ".".join(parts)


def _json_type(value: Any) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "an array", dict: "an object"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def _refuse_common(body: CommonBody) -> None:
    if body.n not in (None, 1):
        raise invalid(f"n={body.n} is not supported; this server returns one choice per request (n=1).", "n", "unsupported_parameter")
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(body, name):
            raise invalid(f"{name} is not supported; leave it unset or 0.", name, "unsupported_parameter")
    if body.repetition_penalty not in (None, 1.0):
        raise invalid("repetition_penalty is not supported; leave it unset or 1.", "repetition_penalty", "unsupported_parameter")
    if body.logit_bias:
        raise invalid("logit_bias is not supported.", "logit_bias", "unsupported_parameter")
    if body.stream_options is not None and not body.stream:
        raise invalid("stream_options can only be set when stream is true.", "stream_options")


def _include_usage(body: CommonBody) -> bool:
    return bool(body.stream and body.stream_options and body.stream_options.include_usage)


def _max_tokens(value: int | None, param: str) -> int | None:
    if value is not None and value < 1:
        raise invalid(f"{param} must be at least 1, got {value}.", param)
    return value


def _sampling(body: CommonBody, limits: Limits, logprobs: int | None) -> SamplingSpec:
    temperature = 1.0 if body.temperature is None else body.temperature
    if not 0.0 <= temperature <= 2.0:
        raise invalid(f"temperature must be between 0 and 2, got {temperature}.", "temperature")
    top_p = 1.0 if body.top_p is None else body.top_p
    if not 0.0 < top_p <= 1.0:
        raise invalid(f"top_p must be in (0, 1], got {top_p}.", "top_p")
    top_k = body.top_k or 0
    if not -1 <= top_k <= INT32_MAX:
        raise invalid(f"top_k must be -1 or 0 (off) or a positive count, got {top_k}.", "top_k")
    if body.seed is not None and not INT64_MIN <= body.seed <= INT64_MAX:
        raise invalid(f"seed must fit in a signed 64-bit integer, got {body.seed}.", "seed")
    stop_token_ids = tuple(body.stop_token_ids or ())
    if any(t < 0 for t in stop_token_ids):
        raise invalid("stop_token_ids must be non-negative token ids.", "stop_token_ids")
    return SamplingSpec(
        temperature=temperature,
        top_p=top_p,
        top_k=max(top_k, 0),
        seed=body.seed,
        stop=_stop(body.stop, limits),
        stop_token_ids=stop_token_ids,
        ignore_eos=bool(body.ignore_eos),
        logprobs=logprobs,
    )


def _stop(stop: str | list[str] | None, limits: Limits) -> tuple[str, ...]:
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if len(stops) > limits.max_stop_sequences:
        raise invalid(f"At most {limits.max_stop_sequences} stop sequences are allowed, got {len(stops)}.", "stop")
    for s in stops:
        if not s:
            raise invalid("Stop sequences must not be empty.", "stop")
        if len(s) > limits.max_stop_length:
            raise invalid(f"Stop sequences must be at most {limits.max_stop_length} characters, got {len(s)}.", "stop")
    return tuple(stops)


def _prompt(prompt: str | list[int] | list[str] | list[list[int]]) -> tuple[str | None, tuple[int, ...] | None]:
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) > 1:
            raise invalid(
                f"Batched prompts ({len(prompt)} prompts) are not supported; send one prompt per request.", "prompt"
            )
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise invalid("prompt must not be empty.", "prompt")
        return prompt, None
    if not prompt:
        raise invalid("prompt must not be empty.", "prompt")
    if any(t < 0 for t in prompt):
        raise invalid("prompt token ids must be non-negative.", "prompt")
    return None, tuple(prompt)


_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


def _messages(messages: list[ChatMessage]) -> tuple[dict[str, str], ...]:
    if not messages:
        raise invalid("messages must contain at least one message.", "messages")
    out = []
    for i, msg in enumerate(messages):
        role = _ROLES.get(msg.role)
        if role is None:
            raise invalid(
                f"Unsupported role {msg.role!r}; expected one of system, developer, user, assistant.",
                f"messages.[{i}].role",
            )
        if msg.tool_calls:
            raise invalid("tool_calls are not supported by this server.", f"messages.[{i}].tool_calls", "unsupported_parameter")
        out.append({"role": role, "content": _content(msg, i)})
    return tuple(out)


def _content(msg: ChatMessage, i: int) -> str:
    if msg.content is None:
        if msg.role == "assistant":
            return ""
        raise invalid(f"Missing content in a {msg.role!r} message.", f"messages.[{i}].content")
    if isinstance(msg.content, str):
        return msg.content
    texts = []
    for j, part in enumerate(msg.content):
        kind = part.get("type")
        if kind != "text":
            raise invalid(
                f"Only text content parts are supported, got {kind!r}.", f"messages.[{i}].content.[{j}].type", "unsupported_content"
            )
        text = part.get("text")
        if not isinstance(text, str):
            raise invalid("A text content part needs a string 'text'.", f"messages.[{i}].content.[{j}].text")
        texts.append(text)
    return "\n".join(texts)
