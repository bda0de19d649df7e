"""Byte-level detokenization: a table of each token's bytes gives what `tokenizers`' decode gives,
token by token and delta by delta, and tokenizers it does not fit keep DecodeStream."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from tokenizers import AddedToken, Tokenizer as HFTokenizer, decoders, models, pre_tokenizers, trainers

from kvmesh.engine.bytelevel import byte_table, token_bytes
from kvmesh.engine.tokenizer import IncrementalDetokenizer, Tokenizer, detokenizer

_TEXT = "héllo wörld, 世界 ok. Ünïcödé 🙂 <|tool|> and\u00a0plain words\n\nthe end"


def _byte_level_bpe(path: Path) -> Path:
    """A trained byte-level BPE (merges of multi-byte characters too) with special and plain added
    tokens, one of them written with characters that stand for no byte."""
    hf = HFTokenizer(models.BPE(unk_token=None))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    corpus = [_TEXT, "the sky is blue, 世界 and 🙂 again", "héllo héllo wörld"] * 30
    hf.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=400, special_tokens=["<s>", "</s>"],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    hf.add_tokens([AddedToken("<|tool|>", special=False), AddedToken("plain words", special=False), "naïve ✓"])
    hf.save(str(path / "tokenizer.json"))
    return path


def _metaspace(path: Path) -> Path:
    """A SentencePiece-style tokenizer (Metaspace): no byte table; DecodeStream stays."""
    hf = HFTokenizer(models.BPE(unk_token="<unk>"))
    hf.pre_tokenizer = pre_tokenizers.Metaspace()
    hf.decoder = decoders.Metaspace()
    hf.train_from_iterator([_TEXT] * 20, trainers.BpeTrainer(vocab_size=200, special_tokens=["<unk>", "<s>"]))
    hf.save(str(path / "tokenizer.json"))
    return path


def _streams(tok: Tokenizer, rng: random.Random) -> list[list[int]]:
    text = tok.encode(_TEXT * 2, add_special_tokens=False)
    garbage = [rng.randrange(tok.vocab_size) for _ in range(300)]  # split and broken UTF-8, specials
    return [text, garbage, text[:30] + garbage[:50] + text[30:]]


def _chunks(ids: list[int], rng: random.Random) -> list[list[int]]:
    """`ids` cut at random places (a fifth of the gaps): deltas of 1 token up to many."""
    cuts = sorted(rng.sample(range(1, len(ids)), len(ids) // 5))
    return [ids[a:b] for a, b in zip([0, *cuts], [*cuts, len(ids)])]


def test_token_bytes_reads_the_stand_in_characters() -> None:
    assert token_bytes("Ġhello") == b" hello"
    assert token_bytes("Ã©") == "é".encode()
    assert token_bytes("<|tool|>") == b"<|tool|>"
    assert token_bytes("a b") == b"a b"  # a plain space stands for no byte: the token's own UTF-8
    assert token_bytes("naïve ✓") == "naïve ✓".encode()


@pytest.mark.parametrize("skip", [True, False])
def test_tiny_table_is_each_tokens_decode(tiny_dir: Path, skip: bool) -> None:
    tok = Tokenizer.from_dir(tiny_dir)
    table = tok.byte_table(skip)
    assert table is not None and len(table) == tok.vocab_size
    assert table[:256] == [bytes([b]) for b in range(256)]
    assert all(b == (b"" if skip else tok.decode([i], skip_special_tokens=False).encode()) for i, b in enumerate(table) if i >= 256)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("skip", [True, False])
def test_deltas_laid_end_to_end_are_the_full_decode(tmp_path: Path, seed: int, skip: bool) -> None:
    tok = Tokenizer.from_dir(_byte_level_bpe(tmp_path))
    assert tok.byte_table(skip) is not None
    rng = random.Random(seed)
    for ids in _streams(tok, rng):
        detok = detokenizer(tok, tok.encode("a prompt", add_special_tokens=False), skip)
        deltas = [detok.push_many(chunk) if rng.random() < 0.7 else "".join(detok.push(t) for t in chunk)
                  for chunk in _chunks(ids, rng)]
        assert "".join(deltas) + detok.flush() == tok.decode(ids, skip_special_tokens=skip)


def test_a_split_character_waits_for_its_last_byte(tmp_path: Path) -> None:
    tok = Tokenizer.from_dir(_byte_level_bpe(tmp_path))
    table = tok.byte_table()
    emoji = "🙂".encode()
    pieces = [next(i for i, b in enumerate(table) if b == bytes([c])) for c in emoji]  # one token a byte
    detok = detokenizer(tok)
    assert [detok.push(t) for t in pieces[:3]] == ["", "", ""]
    assert detok.held_text() == "\ufffd"
    state = detok.snapshot()
    assert detok.push(pieces[3]) == "🙂"
    detok.restore(state)
    ok = tok.encode("ok", add_special_tokens=False)
    assert detok.push_many([pieces[3], *ok]) == "🙂ok"
    detok.push_many(pieces[:2])
    assert detok.flush() == "\ufffd" and detok.flush() == ""  # an unfinished character ends as U+FFFD, once


def test_other_decoders_keep_decode_stream(tmp_path: Path) -> None:
    tok = Tokenizer.from_dir(_metaspace(tmp_path))
    assert tok.byte_table() is None
    ids = tok.encode("the end ok", add_special_tokens=False)
    detok = detokenizer(tok, tok.encode("héllo", add_special_tokens=False))
    assert isinstance(detok, IncrementalDetokenizer)
    assert "".join(detok.push(t) for t in ids) + detok.flush() == " the end ok"


class _Disagrees:
    """A byte-level tokenizer whose decode of one id is not the table's (a release that decodes
    added tokens another way): the table must not be used."""

    def __init__(self, hf: HFTokenizer) -> None:
        self._hf = hf
        self.decoder = hf.decoder

    def __getattr__(self, name: str):  # noqa: ANN204 - everything else is the real tokenizer's
        return getattr(self._hf, name)

    def decode_batch(self, seqs: list[list[int]], skip_special_tokens: bool = True) -> list[str]:
        texts = self._hf.decode_batch(seqs, skip_special_tokens=skip_special_tokens)
        return [t + "!" if seq == [self._hf.token_to_id("<|tool|>")] else t for seq, t in zip(seqs, texts)]


def test_a_table_that_decode_disagrees_with_is_dropped(tmp_path: Path) -> None:
    hf = HFTokenizer.from_file(str(_byte_level_bpe(tmp_path) / "tokenizer.json"))
    assert byte_table(hf, True) is not None
    assert byte_table(_Disagrees(hf), True) is None
