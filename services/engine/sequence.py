"""Per-request state (pure): token ids, progress, block table, status."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from kvmesh.engine.sampling import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREFILLED = "prefilled"  # prefill_only finished; blocks held until release
    FINISHED = "finished"


@dataclass(slots=True, eq=False)
class Sequence:
    request_id: str
    token_ids: list[int]  # prompt + output so far
    num_prompt_tokens: int
    params: SamplingParams
    prefill_only: bool = False
    computed_kv: Any = None  # [2, L, k, H, D] KV of the first k prompt tokens, computed elsewhere
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache (first admission)
    num_committed_blocks: int = 0  # leading blocks registered in the prefix cache
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[bytes] = field(default_factory=list)
    finish_reason: str | None = None
    admitted_once: bool = False
    arrival: int = 0  # order of arrival at the scheduler (ties within one priority)
    grammar: Any = None  # xgrammar matcher of a structured-output request
    prompt_logprobs: list[Any] = field(default_factory=list)  # TokenLogprob of prompt tokens 1.. (when asked)
    prompt_logprobs_sent: bool = False

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def computed_kv_len(self) -> int:
        return 0 if self.computed_kv is None else int(self.computed_kv.shape[2])

    @property
    def target_len(self) -> int:
        """Tokens whose KV this sequence needs computed before it can sample (or finish prefill)."""
        return self.num_prompt_tokens - 1 if self.prefill_only else self.num_tokens

    @property
    def max_cache_hit_tokens(self) -> int:
        # NOTE: a sampling sequence must compute at least its last token to get logits.
        return self.target_len if self.prefill_only else self.num_tokens - 1
