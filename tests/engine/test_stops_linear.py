"""Issue 16, item 7: a long output costs bounded work per token in the stop matcher and the
detokenizer, not work that grows with the text so far (quadratic over the output)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvmesh.engine.stops import StopStringMatcher
from kvmesh.engine.tokenizer import IncrementalDetokenizer, Tokenizer, detokenizer


class _Recording(StopStringMatcher):
    """Records the longest text the matcher searched in one call."""

    longest = 0

    def _held_back(self, text: str) -> int:
        self.longest = max(self.longest, len(text))
        return super()._held_back(text)


def test_the_stop_matcher_searches_only_the_unemitted_tail_however_long_the_output() -> None:
    stops = ("<|end|>", "\n\nUser:")
    matcher = _Recording(stops)
    emitted = []
    for i in range(20_000):  # ~100k characters, with partial stop prefixes now and then
        delta = "<|en" if i % 97 == 0 else ("\n\nUs" if i % 89 == 0 else f"w{i % 10} ")
        text, stopped = matcher.add(delta)
        assert not stopped
        emitted.append(text)
    bound = max(len(s) for s in stops) + len("\n\nUs")  # held-back tail + one delta
    assert matcher.longest <= bound, f"searched {matcher.longest} chars at once: grows with the output"
    assert "".join(emitted) + matcher.flush() == matcher.text


@pytest.mark.parametrize("make", [detokenizer, IncrementalDetokenizer], ids=["byte table", "DecodeStream"])
def test_the_detokenizer_holds_only_an_incomplete_character(tiny_dir: Path, make) -> None:
    tok = Tokenizer.from_dir(tiny_dir)
    ids = tok.encode("héllo wörld, ", add_special_tokens=False) * 2000
    detok = make(tok)
    longest_held = 0
    pieces = []
    for token in ids:
        pieces.append(detok.push(token))
        longest_held = max(longest_held, len(detok.held_text()))
    assert 1 <= longest_held <= 4  # "é" waits for its second byte; one character's worth at most, not the output so far
    assert "".join(pieces) + detok.flush() == tok.decode(ids)
