"""The gateway's text assembly: tokens that arrive together are decoded together, and the text,
the held-back tokens and where a stop string cut are what one token at a time gives."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from kvmesh.engine.tiny import ensure_tiny_model
from kvmesh.engine.tokenizer import IncrementalDetokenizer, Tokenizer, detokenizer
from kvmesh.gateway.text import TextAssembler

_TEXT = "héllo wörld, 世界 ok. Ünïcödé 🙂 and plain words\n\nthe end"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_tiny_model(tmp_path_factory.mktemp("models"))


def _chunks(ids: list[int], rng: random.Random) -> list[list[int]]:
    out, i = [], 0
    while i < len(ids):
        n = rng.randint(1, 9)
        out.append(ids[i : i + n])
        i += n
    return out


def _streams(tok: Tokenizer, rng: random.Random) -> list[list[int]]:
    text_ids = tok.encode(_TEXT * 3, add_special_tokens=False)
    garbage = [rng.randrange(0, tok._tok.get_vocab_size()) for _ in range(300)]  # noqa: SLF001 - random bytes: broken UTF-8
    return [text_ids, garbage, text_ids[:40] + garbage[:40] + text_ids[40:]]


@pytest.mark.parametrize("make", [detokenizer, IncrementalDetokenizer], ids=["byte table", "DecodeStream"])
@pytest.mark.parametrize("seed", range(6))
def test_push_many_gives_what_one_token_at_a_time_gives(tiny_dir: Path, seed: int, make) -> None:
    tok = Tokenizer.from_dir(tiny_dir)
    rng = random.Random(seed)
    for ids in _streams(tok, rng):
        prompt = tok.encode("a prompt ends", add_special_tokens=False)
        one, many = make(tok, prompt), make(tok, prompt)
        for chunk in _chunks(ids, rng):
            assert many.push_many(chunk) == "".join(one.push(t) for t in chunk)
            assert many.held_text() == one.held_text()  # the same text waits for its character
        assert many.flush() == one.flush()


def _reference(tok: Tokenizer, prompt: list[int], stop: tuple[str, ...], chunks: list[list[int]]) -> tuple[str, int | None]:
    """One token at a time through the same assembler's per-token path."""
    asm = TextAssembler(tok, prompt, stop)
    parts, seen = [], 0
    for chunk in chunks:
        text, kept = asm._add_each(chunk)  # noqa: SLF001
        parts.append(text)
        if kept is not None:
            return "".join(parts), seen + kept
        seen += len(chunk)
    return "".join(parts) + asm.finish(), None


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("stop", [(), ("wörld",), ("\n\n", "ok."), ("🙂",), ("never there",)])
def test_the_assembler_cuts_where_one_token_at_a_time_cuts(tiny_dir: Path, seed: int, stop: tuple[str, ...]) -> None:
    tok = Tokenizer.from_dir(tiny_dir)
    rng = random.Random(seed)
    prompt = tok.encode("a prompt ends", add_special_tokens=False)
    ids = tok.encode(_TEXT * 2, add_special_tokens=False)
    chunks = _chunks(ids, rng)
    want = _reference(tok, prompt, stop, chunks)
    asm = TextAssembler(tok, prompt, stop)
    parts, seen, got = [], 0, None
    for chunk in chunks:
        text, kept = asm.add(chunk)
        parts.append(text)
        if kept is not None:
            got = ("".join(parts), seen + kept)
            break
        seen += len(chunk)
    if got is None:
        got = ("".join(parts) + asm.finish(), None)
    assert got == want
    found = [_TEXT.index(s) for s in stop if s in _TEXT]
    if found:  # and both cut the text where the first stop string begins
        assert got[1] is not None and got[0] == _TEXT[: min(found)]
    else:
        assert got == (_TEXT * 2, None)
