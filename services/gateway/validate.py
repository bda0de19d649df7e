"""Validation of OpenAI request bodies into a `GenerationRequest` (pure).

Every input a user can get wrong ends in an `ApiError(400)` that names the offending parameter;
fields that would change the meaning of a request and that this server does not implement
(`best_of`, `suffix`, `functions`, ...) are refused by name rather than silently ignored.
Structured outputs and tools are checked in `structured.py`.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from .errors import ApiError, invalid
from .messages import chat_messages
from .structured import parse_tool_choice, parse_tools, structured_spec, tool_call_schema
from .protocol import (
    ChatBody,
    CompletionBody,
    Endpoint,
    GenerationRequest,
    Limits,
    SamplingSpec,
    StructuredSpec,
    Body,
    CommonBody,
)

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
MAX_LOGPROBS = 20
MAX_LOGIT_BIAS = 300  # entries; vLLM and OpenAI cap the values at +-100


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
    body = validate_body(CompletionBody, data)
    _check_common(body, limits)
    if body.best_of not in (None, 1, body.n):
        raise invalid(f"best_of={body.best_of} is not supported; only best_of=n.", "best_of", "unsupported_parameter")
    if body.suffix:
        raise invalid("suffix is not supported.", "suffix", "unsupported_parameter")
    logprobs = body.logprobs
    if logprobs is not None and not 0 <= logprobs <= MAX_LOGPROBS:
        raise invalid(f"logprobs must be between 0 and {MAX_LOGPROBS}, got {logprobs}.", "logprobs")
    prompt, token_ids = _prompt(body.prompt)
    echo = bool(body.echo)
    prompt_logprobs = logprobs if echo else None
    # NOTE: echo + logprobs + max_tokens=0 is how eval harnesses score a text: prompt logprobs only.
    max_tokens = _max_tokens(body.max_tokens, "max_tokens", minimum=0 if prompt_logprobs is not None else 1)
    return GenerationRequest(
        endpoint=Endpoint.COMPLETIONS,
        model=body.model,
        sampling=_sampling(body, limits, logprobs, structured_spec(body), prompt_logprobs),
        max_tokens=max_tokens,
        stream=bool(body.stream),
        include_usage=_include_usage(body),
        user=body.user,
        prompt=prompt,
        prompt_token_ids=token_ids,
        n=body.n or 1,
        echo=echo,
        priority=body.priority or 0,
    )


def parse_chat(data: dict[str, Any], limits: Limits) -> GenerationRequest:
    body = validate_body(ChatBody, data)
    _check_common(body, limits)
    if body.functions or body.function_call is not None:
        param = "functions" if body.functions else "function_call"
        raise invalid(f"{param} is deprecated and not supported; use tools.", param, "unsupported_parameter")
    tools = parse_tools(body.tools)
    tool_choice, tool_name = parse_tool_choice(body.tool_choice, tools)
    structured = structured_spec(body)
    forced = tool_call_schema(tools, tool_choice, tool_name, body.parallel_tool_calls is not False)
    if forced is not None and structured is not None:
        raise invalid("tool_choice 'required' or a named function cannot be combined with a structured output.", "tool_choice")
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
        sampling=_sampling(body, limits, logprobs, forced or structured),
        max_tokens=max_tokens,
        stream=bool(body.stream),
        include_usage=_include_usage(body),
        user=body.user,
        messages=chat_messages(body.messages),
        max_tokens_param=param,
        n=body.n or 1,
        priority=body.priority or 0,
        tools=tools,
        tool_choice=tool_choice,
        tool_name=tool_name,
    )


def validate_body(model: type[Body], data: dict[str, Any]) -> Any:
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


def _check_common(body: CommonBody, limits: Limits) -> None:
    if body.n is not None and not 1 <= body.n <= limits.max_n:
        raise invalid(f"n must be between 1 and {limits.max_n}, got {body.n}.", "n")
    if body.priority is not None and not INT32_MIN <= body.priority <= INT32_MAX:
        raise invalid(f"priority must fit in a signed 32-bit integer, got {body.priority}.", "priority")
    if body.stream_options is not None and not body.stream:
        raise invalid("stream_options can only be set when stream is true.", "stream_options")


def _include_usage(body: CommonBody) -> bool:
    return bool(body.stream and body.stream_options and body.stream_options.include_usage)


def _max_tokens(value: int | None, param: str, minimum: int = 1) -> int | None:
    if value is not None and value < minimum:
        raise invalid(f"{param} must be at least {minimum}, got {value}.", param)
    return value


def _penalties(body: CommonBody) -> dict[str, float]:
    """presence/frequency in [-2, 2] (OpenAI), repetition > 0 (vLLM; 1 = off)."""
    out = {}
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(body, name) or 0.0
        if not -2.0 <= value <= 2.0:
            raise invalid(f"{name} must be between -2 and 2, got {value}.", name)
        out[name] = value
    repetition = 1.0 if body.repetition_penalty is None else body.repetition_penalty
    if not 0.0 < repetition <= 100.0:
        raise invalid(f"repetition_penalty must be in (0, 100], got {repetition}.", "repetition_penalty")
    out["repetition_penalty"] = repetition
    return out


def _logit_bias(bias: dict[str, float] | None) -> tuple[tuple[int, float], ...]:
    """Token id -> bias in [-100, 100]; ids are checked against the vocabulary in `prepare`."""
    if not bias:
        return ()
    if len(bias) > MAX_LOGIT_BIAS:
        raise invalid(f"logit_bias may name at most {MAX_LOGIT_BIAS} tokens, got {len(bias)}.", "logit_bias")
    out = []
    for key, value in bias.items():
        if not key.isascii() or not key.isdigit():
            raise invalid(f"logit_bias keys must be token ids (non-negative integers), got {key!r}.", "logit_bias")
        if not -100.0 <= value <= 100.0:
            raise invalid(f"logit_bias values must be between -100 and 100, got {value} for token {key}.", "logit_bias")
        out.append((int(key), float(value)))
    return tuple(sorted(out))


def _sampling(
    body: CommonBody,
    limits: Limits,
    logprobs: int | None,
    structured: StructuredSpec | None = None,
    prompt_logprobs: int | None = None,
) -> SamplingSpec:
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
    min_tokens = body.min_tokens or 0
    if not 0 <= min_tokens <= INT32_MAX:
        raise invalid(f"min_tokens must be a non-negative count, got {min_tokens}.", "min_tokens")
    limit = getattr(body, "max_completion_tokens", None) or body.max_tokens
    if limit is not None and min_tokens > limit:
        raise invalid(f"min_tokens ({min_tokens}) must not exceed max_tokens ({limit}).", "min_tokens")
    min_p = body.min_p or 0.0
    if not 0.0 <= min_p <= 1.0:
        raise invalid(f"min_p must be between 0 and 1, got {min_p}.", "min_p")
    return SamplingSpec(
        temperature=temperature,
        top_p=top_p,
        top_k=max(top_k, 0),
        seed=body.seed,
        stop=_stop(body.stop, limits),
        stop_token_ids=stop_token_ids,
        ignore_eos=bool(body.ignore_eos),
        logprobs=logprobs,
        logit_bias=_logit_bias(body.logit_bias),
        min_tokens=min_tokens,
        min_p=min_p,
        structured=structured,
        prompt_logprobs=prompt_logprobs,
        **_penalties(body),
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
