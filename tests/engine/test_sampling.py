"""Per-request sampling and finishing: stop strings, stop tokens, EOS, max_tokens, logprobs."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvmesh.engine.llm import EngineConfig, LLMEngine
from kvmesh.engine.sampling import SamplingParams

PROMPT = [256, 72, 101, 108, 108, 111]


@pytest.fixture(scope="module")
def engine(tiny_dir: Path) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(tiny_dir), num_kv_blocks=64))


def greedy(**kw) -> SamplingParams:
    return SamplingParams(**({"temperature": 0.0, "max_tokens": 24, "ignore_eos": True} | kw))


def test_greedy_output_is_varied(engine: LLMEngine) -> None:
    out = engine.generate([PROMPT], greedy(max_tokens=32))[0]
    assert len(set(out.token_ids)) > 16


def test_max_tokens_finishes_with_length(engine: LLMEngine) -> None:
    out = engine.generate([PROMPT], greedy(max_tokens=5))[0]
    assert (len(out.token_ids), out.finish_reason) == (5, "length")


def test_streamed_text_equals_decoding_all_tokens(engine: LLMEngine) -> None:
    out = engine.generate([PROMPT], greedy(max_tokens=40))[0]
    assert out.text == engine.tokenizer.decode(out.token_ids)


def test_stop_token_id_ends_generation_and_is_included(engine: LLMEngine) -> None:
    full = engine.generate([PROMPT], greedy())[0].token_ids
    stop = full[6]
    out = engine.generate([PROMPT], greedy(stop_token_ids=(stop,)))[0]
    assert out.token_ids == full[: full.index(stop) + 1]
    assert out.finish_reason == "stop"


def test_eos_stops_unless_ignored(engine: LLMEngine, monkeypatch) -> None:
    full = engine.generate([PROMPT], greedy())[0].token_ids
    monkeypatch.setattr(engine, "eos_token_ids", frozenset({full[4]}))
    out = engine.generate([PROMPT], greedy(ignore_eos=False))[0]
    assert (out.token_ids, out.finish_reason) == (full[: full.index(full[4]) + 1], "stop")
    assert engine.generate([PROMPT], greedy())[0].token_ids == full


def test_stop_string_cuts_text(engine: LLMEngine) -> None:
    full = engine.generate([PROMPT], greedy(max_tokens=32))[0]
    stop = full.text[8:10]
    out = engine.generate([PROMPT], greedy(max_tokens=32, stop=(stop,)))[0]
    assert out.finish_reason == "stop"
    assert out.text == full.text[: full.text.index(stop)]
    assert len(out.token_ids) < 32


def test_logprobs_report_chosen_and_top_n(engine: LLMEngine) -> None:
    out = engine.generate([PROMPT], greedy(max_tokens=4, logprobs=3))[0]
    assert out.logprobs is not None and len(out.logprobs) == 4
    for token, lp in zip(out.token_ids, out.logprobs):
        assert lp.token_id == token and len(lp.top_logprobs) == 3
        assert lp.top_logprobs[0][0] == token and lp.logprob == pytest.approx(lp.top_logprobs[0][1])
        assert lp.logprob <= 0.0
    assert engine.generate([PROMPT], greedy(max_tokens=2))[0].logprobs is None


def test_same_seed_same_output_different_seed_differs(engine: LLMEngine) -> None:
    def run(seed: int) -> list[int]:
        return engine.generate([PROMPT], SamplingParams(temperature=1.0, seed=seed, max_tokens=16, ignore_eos=True))[0].token_ids

    assert run(3) == run(3)
    assert run(3) != run(4)


def test_top_k_one_is_greedy(engine: LLMEngine) -> None:
    sampled = engine.generate([PROMPT], SamplingParams(temperature=1.5, top_k=1, seed=1, max_tokens=12, ignore_eos=True))[0]
    assert sampled.token_ids == engine.generate([PROMPT], greedy(max_tokens=12))[0].token_ids


def test_tiny_top_p_is_greedy(engine: LLMEngine) -> None:
    sampled = engine.generate([PROMPT], SamplingParams(temperature=1.0, top_p=1e-6, seed=1, max_tokens=12, ignore_eos=True))[0]
    assert sampled.token_ids == engine.generate([PROMPT], greedy(max_tokens=12))[0].token_ids


@pytest.mark.parametrize(
    "kw, match",
    [({"temperature": -1}, "temperature"), ({"top_k": -1}, "top_k"), ({"max_tokens": 0}, "max_tokens"),
     ({"logprobs": 21}, "logprobs"), ({"stop": ("",)}, "stop")],
)
def test_validate_rejects_out_of_range(kw: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kw).validate()
