"""A deliberately simple generation engine on Hugging Face `transformers`: one request at a time
per step, each with its own non-paged `DynamicCache`. No kvmesh code here at all."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, DynamicCache

MAX_LOGPROBS = 20


class BadRequest(ValueError):
    """The request cannot be served as asked (the server answers INVALID_ARGUMENT)."""


@dataclass(slots=True)
class Sampling:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    max_tokens: int = 16
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None

    def check(self) -> None:
        if not 0.0 <= self.temperature <= 100.0:
            raise BadRequest(f"temperature must be in [0, 100], got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise BadRequest(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0 or self.max_tokens < 1:
            raise BadRequest("top_k must be >= 0 and max_tokens >= 1")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise BadRequest(f"logprobs must be in [0, {MAX_LOGPROBS}]")


@dataclass(slots=True)
class Sequence:
    """One request: prompt, output so far, its own KV cache and sampler state."""

    prompt: list[int]
    sampling: Sampling
    cache: DynamicCache = field(default_factory=DynamicCache)
    output: list[int] = field(default_factory=list)
    emitted: str = ""          # text already streamed
    generator: torch.Generator | None = None
    finish_reason: str | None = None


@dataclass(slots=True)
class Step:
    token_id: int
    text: str                  # the text delta to stream (stop strings cut, partial UTF-8 held back)
    logprob: tuple[float, list[tuple[int, float]]] | None
    finish_reason: str | None


class Engine:
    """`start(prompt, sampling)` then `step(seq)` until `seq.finish_reason` is set."""

    def __init__(self, model_dir: str, dtype: str = "float32") -> None:
        path = Path(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).eval()
        self.tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
        config = json.loads((path / "config.json").read_text())
        eos = config.get("eos_token_id")
        self.eos_ids = frozenset(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        self.vocab_size = int(config["vocab_size"])
        self.max_model_len = int(config.get("max_position_embeddings", 2048))

    def start(self, prompt: list[int], sampling: Sampling) -> Sequence:
        sampling.check()
        if not prompt:
            raise BadRequest("prompt_token_ids must not be empty")
        if any(t >= self.vocab_size for t in prompt):
            raise BadRequest(f"prompt token ids must be in [0, {self.vocab_size})")
        if len(prompt) >= self.max_model_len:
            raise BadRequest(f"prompt has {len(prompt)} tokens; the context is {self.max_model_len}")
        gen = None
        if sampling.seed is not None:
            gen = torch.Generator().manual_seed(sampling.seed)
        return Sequence(list(prompt), sampling, generator=gen)

    @torch.inference_mode()
    def step(self, seq: Sequence) -> Step:
        """One forward pass (the whole prompt first, then one token) and one sampled token."""
        fed = seq.prompt if not seq.output else seq.output[-1:]
        ids = torch.tensor([fed])                                               # [1, T]
        logits = self.model(input_ids=ids, past_key_values=seq.cache, use_cache=True).logits[0, -1].float()  # [V]
        token = self._sample(logits, seq)
        seq.output.append(token)
        logprob = self._logprob(logits, token, seq.sampling.logprobs)
        seq.finish_reason = self._finish(seq, token)
        return Step(token, self._text_delta(seq), logprob, seq.finish_reason)

    def _sample(self, logits: torch.Tensor, seq: Sequence) -> int:
        p = seq.sampling
        if p.temperature == 0.0:
            return int(logits.argmax())
        logits = logits / p.temperature
        if p.top_k:
            kth = torch.topk(logits, min(p.top_k, logits.numel())).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)                                   # [V]
        if p.top_p < 1.0:
            sorted_probs, order = probs.sort(descending=True)
            keep = sorted_probs.cumsum(0) - sorted_probs < p.top_p
            probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_probs[keep])
        return int(torch.multinomial(probs, 1, generator=seq.generator))

    @staticmethod
    def _logprob(logits: torch.Tensor, token: int, top_n: int | None) -> tuple[float, list[tuple[int, float]]] | None:
        if top_n is None:
            return None
        logp = torch.log_softmax(logits, dim=-1)                                # [V]
        top = torch.topk(logp, top_n) if top_n else None
        pairs = [(int(i), float(v)) for v, i in zip(top.values, top.indices)] if top is not None else []
        return float(logp[token]), pairs

    def _finish(self, seq: Sequence, token: int) -> str | None:
        p = seq.sampling
        if token in p.stop_token_ids or (not p.ignore_eos and token in self.eos_ids):
            return "stop"
        if p.stop and any(s in self._text(seq) for s in p.stop):
            return "stop"
        if len(seq.output) >= p.max_tokens or len(seq.prompt) + len(seq.output) >= self.max_model_len:
            return "length"
        return None

    def _text(self, seq: Sequence) -> str:
        return self.tokenizer.decode(seq.output, skip_special_tokens=True)

    def _text_delta(self, seq: Sequence) -> str:
        text = self._text(seq)
        hold = max((len(s) - 1 for s in seq.sampling.stop), default=0)
        cut = min((text.find(s) for s in seq.sampling.stop if s in text), default=-1)
        if cut >= 0:
            text = text[:cut]
        elif seq.finish_reason is None:
            text = text.rstrip("\ufffd")                    # a partial UTF-8 character waits for its next token
            text = text[: len(text) - hold] if hold else text
        if not text.startswith(seq.emitted):
            return ""
        delta, seq.emitted = text[len(seq.emitted):], text
        return delta
