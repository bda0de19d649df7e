"""What the engine hands back (torch-free): per-step outputs, errors, stats."""

from __future__ import annotations

from dataclasses import dataclass, field


class ContextLengthError(ValueError):
    """The prompt does not fit the model's context; maps to HTTP 400 / INVALID_ARGUMENT."""

    def __init__(self, prompt_tokens: int, max_model_len: int) -> None:
        super().__init__(
            f"prompt has {prompt_tokens} tokens but the model's context is {max_model_len} tokens "
            f"(the prompt must be shorter than max_model_len to leave room for output)"
        )
        self.prompt_tokens = prompt_tokens
        self.max_model_len = max_model_len


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """Logprob of the chosen token plus the top-N alternatives, highest first."""

    token_id: int
    logprob: float
    top_logprobs: list[tuple[int, float]] = field(default_factory=list)


@dataclass(slots=True)
class RequestOutput:
    """What one request produced in one engine step (a delta, not the whole text)."""

    request_id: str
    new_token_ids: list[int]
    new_text: str
    finished: bool
    finish_reason: str | None  # "stop" | "length" | "abort" | "prefill"
    logprobs: list[TokenLogprob] | None
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int
    num_computed_tokens: int
    prompt_logprobs: list[TokenLogprob] | None = None  # once, on the first output, when asked
    # Once, on the output with its first token (or its end): seconds from add_request to the first
    # step that ran it (waiting in the engine), and from that step's start to this output (its prefill)
    queue_s: float | None = None
    prefill_s: float | None = None


@dataclass(frozen=True, slots=True)
class Completion:
    """Result of `LLMEngine.generate` for one prompt."""

    token_ids: list[int]
    text: str
    finish_reason: str | None
    logprobs: list[TokenLogprob] | None


@dataclass(frozen=True, slots=True)
class EngineStats:
    num_running: int
    num_waiting: int
    num_free_blocks: int
    num_total_blocks: int
    prefix_query_tokens: int
    prefix_hit_tokens: int
    num_preemptions: int
    num_prompt_tokens_computed: int
    num_generated_tokens: int
    # The steps it ran, cumulative, by kind (engine/batchstats.py): steps that only decode, and
    # steps that prefill (decode rows riding along). Per kind: steps, decode rows, the KV tokens
    # their decode attention read (each step's rows × its longest decode context: the torch
    # backend pads every row to it), wall time in µs and the stepping thread's CPU time in µs.
    decode_steps: int = 0
    decode_step_rows: int = 0
    decode_step_padded_kv_tokens: int = 0
    decode_step_micros: int = 0
    prefill_steps: int = 0
    prefill_step_rows: int = 0
    prefill_step_padded_kv_tokens: int = 0
    prefill_step_micros: int = 0
    decode_step_cpu_micros: int = 0
    prefill_step_cpu_micros: int = 0
    between_steps_micros: int = 0  # time it had unfinished sequences and was not in a step
