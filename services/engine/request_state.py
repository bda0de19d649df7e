"""Per-request output bookkeeping (pure): detokenization, stop checks, finish reasons."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from kvmesh.engine.outputs import RequestOutput, TokenLogprob
from kvmesh.engine.sequence import Sequence
from kvmesh.engine.stops import StopStringMatcher
from kvmesh.engine.tokenizer import Detokenizer, Tokenizer, detokenizer


@dataclass(slots=True)
class RequestState:
    seq: Sequence
    detokenizer: Detokenizer | None  # None: token ids only (the caller makes the text)
    matcher: StopStringMatcher | None
    generator: Any  # the request's sampling seed (its own, or drawn by the engine)
    new_token_ids: list[int] = field(default_factory=list)
    new_text: str = ""
    new_logprobs: list[TokenLogprob] = field(default_factory=list)
    all_logprobs: list[TokenLogprob] = field(default_factory=list)
    added_at: float = field(default_factory=time.perf_counter)  # add_request
    first_step_at: float | None = None  # the start of the first step that ran it
    timed: bool = False                 # its queue and prefill times went out

    @classmethod
    def create(cls, seq: Sequence, tokenizer: Tokenizer, generator: Any, detokenize: bool = True) -> RequestState:
        """With `detokenize` False no text is made and stop strings are not checked (the caller
        does both, e.g. the gateway on the token stream); stop token ids still end the request."""
        if not detokenize:
            return cls(seq, None, None, generator)
        detok = detokenizer(tokenizer, seq.token_ids[: seq.num_prompt_tokens])
        return cls(seq, detok, StopStringMatcher(seq.params.stop), generator)

    def append_token(
        self, token: int, logprob: TokenLogprob | None, eos_ids: frozenset[int], max_model_len: int
    ) -> str | None:
        """Record a sampled token; return the finish reason if the request is now done."""
        seq, p = self.seq, self.seq.params
        seq.token_ids.append(token)
        self.new_token_ids.append(token)
        if logprob is not None:
            self.new_logprobs.append(logprob)
        if token in p.stop_token_ids or (not p.ignore_eos and token in eos_ids):
            self._emit(self._flush())
            return "stop"
        if self.detokenizer is not None:
            delta, stopped = self.matcher.add(self.detokenizer.push(token))
            self._emit(delta)
            if stopped:
                return "stop"
        if seq.num_output_tokens >= p.max_tokens or seq.num_tokens >= max_model_len:
            self._emit(self._flush())
            return "length"
        return None

    def _flush(self) -> str:
        if self.detokenizer is None:
            return ""
        delta, stopped = self.matcher.add(self.detokenizer.flush())
        return delta if stopped else delta + self.matcher.flush()

    def _emit(self, text: str) -> None:
        if text:
            self.new_text += text

    def take_output(self, finished: bool, finish_reason: str | None) -> RequestOutput:
        """The delta since the last output, then reset the delta."""
        seq = self.seq
        out = RequestOutput(
            request_id=seq.request_id,
            new_token_ids=self.new_token_ids,
            new_text=self.new_text,
            finished=finished,
            finish_reason=finish_reason,
            logprobs=self.new_logprobs if seq.params.logprobs is not None else None,
            num_prompt_tokens=seq.num_prompt_tokens,
            num_output_tokens=seq.num_output_tokens,
            num_cached_tokens=seq.num_cached_tokens,
            num_computed_tokens=seq.num_computed_tokens,
        )
        if seq.params.prompt_logprobs is not None and not seq.prompt_logprobs_sent and (finished or self.new_token_ids):
            out.prompt_logprobs, seq.prompt_logprobs_sent = list(seq.prompt_logprobs), True
        if not self.timed and self.first_step_at is not None and (finished or self.new_token_ids):
            out.queue_s, out.prefill_s = self.first_step_at - self.added_at, time.perf_counter() - self.first_step_at
            self.timed = True
        self.all_logprobs.extend(self.new_logprobs)
        self.new_token_ids, self.new_text, self.new_logprobs = [], "", []
        return out
