"""Structured outputs: xgrammar grammars compiled against the model's vocabulary, one matcher
per request, and the token mask applied to the logits [S, V] in place, on CPU or GPU.

Per step: the matchers of the rows about to be sampled fill one int32 bitmask [S, ceil(V/32)] on
the host (no device sync), it goes to the logits' device without blocking, and xgrammar sets every
disallowed logit to -inf. After sampling (the sampler's one sync has the tokens on the host
already) each matcher accepts its token. A grammar that cannot be compiled raises
`GrammarError` with xgrammar's message (INVALID_ARGUMENT at the worker, 400 at the gateway).

JSON schemas compile without free whitespace (`any_whitespace=False`, vLLM's
`disable_any_whitespace`): a weak model cannot wander into endless spaces, and the output is the
compact JSON a client parses anyway.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence as Seq
from typing import Any

import torch


def _xgr() -> Any:
    """xgrammar, imported on first use: importing it takes ~1.5 s on 2 cores (it imports
    transformers), at every engine's start, and only a structured output needs it."""
    import xgrammar  # noqa: PLC0415

    return xgrammar


class GrammarError(ValueError):
    """The request's structured-output spec cannot be compiled."""


class GrammarCompiler:
    """Compiles (kind, spec) pairs against one vocabulary; keeps the last `cache_size` compiled.
    Thread-safe: a worker may compile ahead (validation, cache warm-up) off the engine's thread."""

    def __init__(self, tokenizer_json: str, vocab: dict[str, int], vocab_size: int, stop_token_ids: Seq[int], cache_size: int = 64) -> None:
        encoded = [""] * vocab_size  # [V]: ids the tokenizer does not define (padding) stay empty
        for token, i in vocab.items():
            if 0 <= i < vocab_size:
                encoded[i] = token
        xgr = _xgr()
        meta = xgr.TokenizerInfo._detect_metadata_from_hf(tokenizer_json)
        self.info = xgr.TokenizerInfo(
            encoded,
            meta["vocab_type"],
            vocab_size=vocab_size,
            stop_token_ids=sorted(stop_token_ids),
            add_prefix_space=meta["add_prefix_space"],
        )
        self.vocab_size = vocab_size
        self._compiler = xgr.GrammarCompiler(self.info, max_threads=1, cache_enabled=False)
        self._cache: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()

    def compile(self, kind: str, spec: str) -> Any:
        """A compiled grammar for `kind` ("json" schema text, "regex", "grammar" EBNF)."""
        key = (kind, spec)
        with self._lock:
            compiled = self._cache.get(key)
            if compiled is None:
                compiled = self._compile(kind, spec)
                self._cache[key] = compiled
                if len(self._cache) > self._cache_size:
                    self._cache.popitem(last=False)
            self._cache.move_to_end(key)
            return compiled

    def _compile(self, kind: str, spec: str) -> Any:
        try:
            if kind == "json":
                json.loads(spec)
                return self._compiler.compile_grammar(json_schema_grammar(spec))
            if kind == "regex":
                return self._compiler.compile_regex(spec)
            if kind == "grammar":
                return self._compiler.compile_grammar(spec)
        except (RuntimeError, ValueError, TypeError) as exc:  # xgrammar's compile errors
            raise GrammarError(f"invalid {kind} for structured output: {_first_line(exc)}") from None
        raise GrammarError(f"unknown structured output kind {kind!r}")

    def matcher(self, kind: str, spec: str) -> Any:
        """A fresh matcher (one request's grammar state)."""
        return _xgr().GrammarMatcher(self.compile(kind, spec))


# NOTE: xgrammar 0.2.8 writes strings with maxLength/pattern as `[^"\\\r\n]{0,n}`, which lets raw
# control characters into a JSON string (invalid JSON), and its string classes accept UTF-8
# encoded surrogates (not UTF-8 at all). A random-weight model finds both at once. We narrow
# every string character class to JSON's: no U+0000-U+001F, quote, backslash or surrogate.
_LOOSE_STRING_CHARS = ('[^\\"\\\\\\r\\n]', '[^\\0-\\x1f\\"\\\\\\r\\n]')
_JSON_STRING_CHAR = '[^\\0-\\x1f\\"\\\\\\uD800-\\uDFFF]'


def json_schema_grammar(schema: str) -> Any:
    """xgrammar's grammar for a JSON schema: compact separators, no free whitespace, strict."""
    text = str(_xgr().Grammar.from_json_schema(schema, any_whitespace=False, strict_mode=True))
    for loose in _LOOSE_STRING_CHARS:
        text = text.replace(loose, _JSON_STRING_CHAR)
    return _xgr().Grammar.from_ebnf(text)


def apply_grammar_masks(logits: torch.Tensor, matchers: Seq[Any | None]) -> None:
    """Set logits [S, V] to -inf where row i's matcher (None = unconstrained) forbids the token."""
    rows = [i for i, m in enumerate(matchers) if m is not None and not m.is_terminated()]
    if not rows:
        return
    vocab = logits.shape[1]
    xgr = _xgr()
    bitmask = xgr.allocate_token_bitmask(len(matchers), vocab)  # [S, ceil(V/32)] int32, CPU, all allowed
    for i in rows:
        matchers[i].fill_next_token_bitmask(bitmask, i)
    if logits.device.type == "cuda":
        bitmask = bitmask.pin_memory().to(logits.device, non_blocking=True)
    # NOTE: unconstrained rows keep an all-ones mask, so no row index list has to reach the device.
    xgr.apply_token_bitmask_inplace(logits, bitmask, vocab_size=vocab)


def advance(matcher: Any | None, token: int) -> bool:
    """Feed the sampled token to the matcher; False when the grammar refused it."""
    if matcher is None or matcher.is_terminated():
        return True
    return bool(matcher.accept_token(token))


_LOG_PREFIX = re.compile(r"^\[[^\]]*\]\s*\S+:\d+:\s*")  # "[12:00:00] /project/cpp/x.cc:83: "


def _first_line(exc: Exception) -> str:
    text = str(exc).strip() or type(exc).__name__
    return _LOG_PREFIX.sub("", text.splitlines()[0])[:500]
