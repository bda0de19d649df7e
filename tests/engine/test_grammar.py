"""xgrammar grammars on the tiny model's vocabulary: masks, advancing, compile errors."""

from __future__ import annotations

import json

import pytest
import torch

from kvmesh.engine.grammar import GrammarCompiler, GrammarError, advance, apply_grammar_masks
from kvmesh.engine.tiny import EOS_ID, resolve_model
from kvmesh.engine.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def compiler() -> GrammarCompiler:
    path = resolve_model("tiny")
    tok = Tokenizer.from_dir(path)
    vocab = json.loads((path / "tokenizer.json").read_text())
    ids = {**vocab["model"]["vocab"], **{t["content"]: t["id"] for t in vocab["added_tokens"]}}
    return GrammarCompiler((path / "tokenizer.json").read_text(), ids, tok.vocab_size, [EOS_ID])


def greedy_under_grammar(compiler: GrammarCompiler, kind: str, spec: str, prefer: list[int]) -> bytes:
    """Walk the grammar, always taking the first allowed token from `prefer` (then the lowest id)."""
    matcher = compiler.matcher(kind, spec)
    out = []
    for _ in range(64):
        logits = torch.zeros(1, compiler.vocab_size)
        logits[0, prefer] = torch.arange(len(prefer), 0, -1, dtype=torch.float32)
        apply_grammar_masks(logits, [matcher])
        token = int(logits.argmax())
        assert torch.isfinite(logits[0, token])
        assert advance(matcher, token)
        if token == EOS_ID:
            return bytes(out)
        out.append(token)
    raise AssertionError("grammar did not terminate")


def test_regex_mask_allows_only_matching_tokens(compiler: GrammarCompiler) -> None:
    assert greedy_under_grammar(compiler, "regex", "(yes|no)", prefer=[ord("n"), ord("y")]) == b"no"


def test_choice_grammar_and_json_schema(compiler: GrammarCompiler) -> None:
    assert greedy_under_grammar(compiler, "grammar", 'root ::= "left" | "right"', prefer=[ord("r")]) == b"right"
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    text = greedy_under_grammar(compiler, "json", json.dumps(schema), prefer=[ord("f")])
    assert json.loads(text) == {"ok": False}


def test_unconstrained_rows_are_untouched(compiler: GrammarCompiler) -> None:
    matcher = compiler.matcher("regex", "a")
    logits = torch.zeros(2, compiler.vocab_size)
    apply_grammar_masks(logits, [None, matcher])
    assert torch.isfinite(logits[0]).all()
    assert torch.isfinite(logits[1]).nonzero().flatten().tolist() == [ord("a")]
    assert not advance(matcher, ord("b"))


@pytest.mark.parametrize(
    ("kind", "spec", "message"),
    [
        ("json", '{"type": "nope"}', 'invalid json for structured output: Unsupported type "nope"'),
        ("json", "{", "invalid json for structured output: Expecting property name enclosed in double quotes"),
        ("regex", "((", "invalid regex for structured output: Regex parsing error"),
        ("grammar", "root ::= ", "invalid grammar for structured output: EBNF parser error"),
    ],
)
def test_compile_errors_carry_the_engine_message(compiler: GrammarCompiler, kind: str, spec: str, message: str) -> None:
    with pytest.raises(GrammarError) as info:
        compiler.compile(kind, spec)
    assert str(info.value).startswith(message)
