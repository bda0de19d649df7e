"""OpenAI request bodies (pydantic, strict types) and the validated request the gateway works on."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

class Endpoint(Enum):
    COMPLETIONS = "completions"
    CHAT = "chat"


@dataclass(frozen=True, slots=True)
class Limits:
    max_stop_sequences: int = 4
    max_stop_length: int = 256


@dataclass(frozen=True, slots=True)
class SamplingSpec:
    """Sampling as the decode worker receives it (max_tokens is resolved later, against the prompt)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None  # top-N per token; None = off


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """One validated request: exactly one of prompt / prompt_token_ids / messages is set."""

    endpoint: Endpoint
    model: str
    sampling: SamplingSpec
    max_tokens: int | None
    stream: bool = False
    include_usage: bool = False
    user: str | None = None
    prompt: str | None = None
    prompt_token_ids: tuple[int, ...] | None = None
    messages: tuple[dict[str, str], ...] | None = None
    max_tokens_param: str = "max_tokens"


class Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class StreamOptions(Body):
    include_usage: bool | None = None


class CommonBody(Body):
    model: str
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    n: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: str | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None


class CompletionBody(CommonBody):
    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = None
    echo: bool | None = None
    suffix: str | None = None
    best_of: int | None = None


class ChatMessage(Body):
    role: str
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[Any] | None = None


class ChatBody(CommonBody):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    functions: list[Any] | None = None
    function_call: Any = None
    response_format: dict[str, Any] | None = None


class MirrorUpdate(BaseModel):
    """PUT /admin/mirror: the fraction of requests mirrored to the canary from now on."""

    model_config = ConfigDict(extra="forbid")

    sample: float = Field(ge=0.0, le=1.0)
