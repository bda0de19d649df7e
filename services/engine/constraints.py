"""The engine's per-step logits processing: grammar masks, then penalties / bias / min_tokens.

`StepConstraints` is a logits processor `fn(logits [S, V], params) -> [S, V]` for the sampler.
The engine binds the step's sampled sequences first (`bind`), since penalties need each row's
tokens and grammars its matcher, and after sampling feeds the chosen tokens back (`accept`).
A sequence's grammar matcher lives on the sequence (`seq.grammar`), made by `start` when the
request arrives; a spec that does not compile raises `GrammarError` (a ValueError) there, so
the worker answers INVALID_ARGUMENT before any work is queued.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence as Seq
from pathlib import Path

import torch
from tokenizers import Tokenizer

from kvmesh.engine.grammar import GrammarCompiler, advance, apply_grammar_masks
from kvmesh.engine.logits import apply_logits_processors
from kvmesh.engine.sampling import SamplingParams
from kvmesh.engine.sequence import Sequence

log = logging.getLogger(__name__)


class StepConstraints:
    def __init__(self, model_dir: Path, vocab_size: int, eos_token_ids: frozenset[int]) -> None:
        self.model_dir = model_dir
        self.vocab_size = vocab_size
        self.eos_token_ids = eos_token_ids
        self._compiler: GrammarCompiler | None = None
        self._lock = threading.Lock()
        self._seqs: Seq[Sequence] = ()

    def start(self, seq: Sequence) -> None:
        """Give `seq` its grammar matcher when it asks for a structured output."""
        if seq.params.structured is not None:
            kind, spec = seq.params.structured
            seq.grammar = self.compiler().matcher(kind, spec)

    def precompile(self, kind: str, spec: str) -> None:
        """Compile ahead, from any thread: raises GrammarError now, and `start` finds it cached."""
        self.compiler().compile(kind, spec)

    def compiler(self) -> GrammarCompiler:
        # NOTE: built on the first structured request: a 150k vocabulary takes a moment to index.
        with self._lock:
            if self._compiler is None:
                self._compiler = self._build_compiler()
            return self._compiler

    def _build_compiler(self) -> GrammarCompiler:
        text = (self.model_dir / "tokenizer.json").read_text(encoding="utf-8")
        vocab = Tokenizer.from_str(text).get_vocab(with_added_tokens=True)
        return GrammarCompiler(text, vocab, self.vocab_size, sorted(self.eos_token_ids))

    def bind(self, seqs: Seq[Sequence]) -> None:
        """The sequences whose rows the next call processes, in row order."""
        self._seqs = seqs

    def __call__(self, logits: torch.Tensor, params: Seq[SamplingParams]) -> torch.Tensor:
        seqs = self._seqs
        assert len(seqs) == logits.shape[0], "bind() the step's sequences before sampling"
        if any(s.grammar is not None for s in seqs):
            logits = logits.clone()
            apply_grammar_masks(logits, [s.grammar for s in seqs])
        return apply_logits_processors(
            logits, params, [s.token_ids for s in seqs], [s.num_prompt_tokens for s in seqs], self.eos_token_ids
        )

    def accept(self, seqs: Seq[Sequence], tokens: Seq[int]) -> None:
        """Advance each grammar by its sampled token."""
        for seq, token in zip(seqs, tokens):
            if not advance(seq.grammar, token):
                log.warning("request %s: grammar refused token %d", seq.request_id, token)
