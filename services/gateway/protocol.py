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
    max_n: int = 8


class GuideKind(Enum):
    """What constrains the output: the grammar kinds of `response_format` and vLLM's guided_*."""

    JSON = "json"  # spec: a JSON schema (json_object: {"type": "object"})
    REGEX = "regex"
    GRAMMAR = "grammar"  # spec: EBNF (guided_choice becomes one)


@dataclass(frozen=True, slots=True)
class StructuredSpec:
    kind: GuideKind
    spec: str


class ToolChoice(Enum):
    NONE = "none"
    AUTO = "auto"
    REQUIRED = "required"
    NAMED = "named"


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """One function the model may call: name, description, JSON schema of its arguments."""

    name: str
    description: str | None
    parameters: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        """The OpenAI `tools` entry, as chat templates expect it."""
        function: dict[str, Any] = {"name": self.name, "parameters": self.parameters}
        if self.description is not None:
            function["description"] = self.description
        return {"type": "function", "function": function}


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
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias added to its logit)
    min_tokens: int = 0
    min_p: float = 0.0
    structured: StructuredSpec | None = None
    prompt_logprobs: int | None = None  # top-N per prompt token (completions echo); None = off


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
    messages: tuple[dict[str, Any], ...] | None = None
    max_tokens_param: str = "max_tokens"
    n: int = 1
    echo: bool = False
    priority: int = 0  # lower runs first (vLLM's semantics)
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: ToolChoice = ToolChoice.NONE
    tool_name: str | None = None  # the function named by tool_choice


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
    min_tokens: int | None = None
    min_p: float | None = None
    priority: int | None = None
    response_format: dict[str, Any] | None = None
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    structured_outputs: dict[str, Any] | None = None


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
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class ChatBody(CommonBody):
    messages: list[ChatMessage]
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    functions: list[Any] | None = None
    function_call: Any = None


class MirrorUpdate(BaseModel):
    """PUT /admin/mirror: the fraction of requests mirrored to the canary from now on."""

    model_config = ConfigDict(extra="forbid")

    sample: float = Field(ge=0.0, le=1.0)
