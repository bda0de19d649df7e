"""Token id → bytes for byte-level BPE tokenizers (GPT-2, Llama 3, Qwen, DeepSeek): pure, torch-free.

A byte-level BPE token is a string of stand-in characters, one per byte (GPT-2's
`bytes_to_unicode`), so a sequence's text is the UTF-8 of its tokens' bytes laid end to end. With
that table, incremental detokenization is a list lookup per token and an incremental UTF-8 decode
per delta (`ByteLevelDetokenizer`), where `tokenizers`' DecodeStream decodes its window of ids
twice a step.

`byte_table` follows what `tokenizers` does in `decode` with a `ByteLevel` decoder: a token whose
characters all stand for bytes becomes those bytes, any other token (an added token written in
plain text) its own UTF-8, a special token nothing when special tokens are skipped, and the whole
is decoded as UTF-8 with each bad sequence replaced by U+FFFD. It builds the table only for a
tokenizer whose decoder is exactly `ByteLevel`, and keeps it only when `decode` agrees with it on
a sample of ids and sequences (`_agrees`): any other tokenizer, or a `tokenizers` release that
decodes otherwise, keeps DecodeStream.
"""

from __future__ import annotations

import codecs
import random
from typing import Any

_SAMPLE_IDS = 4096   # single ids checked against `decode` (all of them in a smaller vocabulary)
_SAMPLE_SEQS = 256   # random sequences of 1-16 ids checked too (bytes split across tokens)


def _byte_chars() -> dict[str, int]:
    """GPT-2's stand-in character of each byte (printable Latin-1 stands for itself)."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {chr(b): b for b in kept}
    shifted = 0
    for b in range(256):
        if b not in kept:
            chars[chr(256 + shifted)] = b
            shifted += 1
    return chars


_CHAR_BYTES = _byte_chars()
_TO_LATIN1 = str.maketrans({c: chr(b) for c, b in _CHAR_BYTES.items()})
_BYTE_CHARS = frozenset(_CHAR_BYTES)


def token_bytes(token: str) -> bytes:
    """A byte-level token's bytes; a token with a character that stands for no byte, its UTF-8."""
    if _BYTE_CHARS.issuperset(token):
        return token.translate(_TO_LATIN1).encode("latin-1")
    return token.encode("utf-8")


def byte_table(hf: Any, skip_special_tokens: bool) -> list[bytes] | None:
    """Each id's bytes (index = token id), or None where `hf` (a `tokenizers.Tokenizer`) is not a
    plain byte-level tokenizer or its `decode` disagrees with the table."""
    from tokenizers import decoders

    if type(hf.decoder) is not decoders.ByteLevel:
        return None
    size = hf.get_vocab_size(with_added_tokens=True)
    special = {i for i, t in hf.get_added_tokens_decoder().items() if t.special}
    table: list[bytes] = []
    for i in range(size):
        token = hf.id_to_token(i)
        table.append(b"" if token is None or (skip_special_tokens and i in special) else token_bytes(token))
    return table if _agrees(hf, table, skip_special_tokens, special) else None


def _agrees(hf: Any, table: list[bytes], skip_special_tokens: bool, special: set[int]) -> bool:
    """`hf.decode` gives the table's text for sampled single ids (every added token among them)
    and for random sequences of ids."""
    rng = random.Random(0)
    size = len(table)
    ids = list(range(size)) if size <= _SAMPLE_IDS else sorted({*rng.sample(range(size), _SAMPLE_IDS), *special})
    seqs = [[i] for i in ids] + [[rng.randrange(size) for _ in range(rng.randint(1, 16))] for _ in range(_SAMPLE_SEQS)]
    texts = hf.decode_batch(seqs, skip_special_tokens=skip_special_tokens)
    return all(text == b"".join(table[i] for i in seq).decode("utf-8", "replace") for seq, text in zip(seqs, texts))


_UTF8 = codecs.getincrementaldecoder("utf-8")


class ByteLevelDetokenizer:
    """Token ids to text deltas by a `byte_table`: a token is a list lookup of its bytes and a delta
    one incremental UTF-8 decode of them (U+FFFD for each bad sequence, as `decode`). A character
    split across tokens waits in the decoder until its last byte comes, and the deltas laid end to
    end are `decode` of all the ids. The methods are `IncrementalDetokenizer`'s."""

    def __init__(self, table: list[bytes]) -> None:
        self._table = table
        self._utf8 = _UTF8("replace")

    def push(self, token_id: int) -> str:
        """Add one token; return the newly completed text (possibly empty)."""
        return self._utf8.decode(self._bytes_of(token_id))

    def push_many(self, token_ids: list[int]) -> str:
        """Add several tokens; return the newly completed text (what `push` of each would have, joined)."""
        table = self._table
        try:
            data = b"".join([table[t] for t in token_ids])
        except IndexError:  # NOTE: an id past the vocabulary decodes to nothing, as in `decode`
            data = b"".join([self._bytes_of(t) for t in token_ids])
        return self._utf8.decode(data)

    def _bytes_of(self, token_id: int) -> bytes:
        return self._table[token_id] if 0 <= token_id < len(self._table) else b""

    def snapshot(self) -> tuple[Any, list[int]]:
        """The state, for `restore`: text made from here on can be made again."""
        return self._utf8.getstate(), []

    def restore(self, state: tuple[Any, list[int]]) -> None:
        self._utf8.setstate(state[0])

    def held_text(self) -> str:
        """What `flush` would return now, without taking it."""
        return self._utf8.getstate()[0].decode("utf-8", "replace")

    def flush(self) -> str:
        """The bytes still held back, as text (an incomplete character decodes to U+FFFD)."""
        return self._utf8.decode(b"", final=True)
