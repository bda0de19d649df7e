"""LLMEngine behaviour on the tiny model: batching, prefix caching, KV movement, preemption."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kvmesh.engine.llm import EngineConfig, LLMEngine
from kvmesh.engine.outputs import ContextLengthError
from kvmesh.engine.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)


def make_engine(tiny_dir: Path, **kw) -> LLMEngine:
    kw.setdefault("num_kv_blocks", 64)
    return LLMEngine(EngineConfig(model=str(tiny_dir), **kw))


def prompts(n: int, length: int = 21) -> list[list[int]]:
    g = torch.Generator().manual_seed(7)
    return [torch.randint(0, 256, (length + 3 * i,), generator=g).tolist() for i in range(n)]


def run_alone(tiny_dir: Path, prompt: list[int], params: SamplingParams = GREEDY) -> list[int]:
    return make_engine(tiny_dir).generate([prompt], params)[0].token_ids


def drain(engine: LLMEngine) -> dict[str, list[int]]:
    tokens: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
    return tokens


def test_batched_decode_with_staggered_joins_matches_running_alone(tiny_dir: Path) -> None:
    ps = prompts(8)
    alone = [run_alone(tiny_dir, p) for p in ps]
    engine = make_engine(tiny_dir, max_num_batched_tokens=64)
    tokens: dict[str, list[int]] = {}
    for step in range(200):
        if step < 8:
            engine.add_request(f"r{step}", ps[step], GREEDY)  # one new request joins each step
        if not engine.has_unfinished_requests():
            break
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
    assert [tokens[f"r{i}"] for i in range(8)] == alone


def test_seeded_sampling_is_reproducible_inside_a_batch(tiny_dir: Path) -> None:
    ps = prompts(4)
    params = [SamplingParams(temperature=0.9, top_p=0.9, top_k=50, seed=100 + i, max_tokens=16, ignore_eos=True) for i in range(4)]
    alone = [run_alone(tiny_dir, p, sp) for p, sp in zip(ps, params)]
    batched = make_engine(tiny_dir).generate(ps, params)
    assert [c.token_ids for c in batched] == alone
    other_seed = SamplingParams(temperature=0.9, top_p=0.9, top_k=50, seed=999, max_tokens=16, ignore_eos=True)
    assert run_alone(tiny_dir, ps[0], other_seed) != alone[0]


def test_prefix_cache_hit_gives_same_output_as_cold_run(tiny_dir: Path) -> None:
    prompt = prompts(1, length=40)[0]
    engine = make_engine(tiny_dir)
    cold = engine.generate([prompt], GREEDY)[0]
    assert engine.cached_prefix_blocks(prompt) == 2
    engine.add_request("warm", prompt, GREEDY)
    first = engine.step()[0]
    assert first.num_cached_tokens == 32
    rest = drain(engine)["warm"]
    assert first.new_token_ids + rest == cold.token_ids
    stats = engine.stats()
    assert (stats.prefix_query_tokens, stats.prefix_hit_tokens) == (80, 32)


def test_exported_kv_continues_in_fresh_engine(tiny_dir: Path) -> None:
    prompt = prompts(1, length=30)[0]
    reference = run_alone(tiny_dir, prompt, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    a = make_engine(tiny_dir)
    a.add_request("r", prompt, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    produced: list[int] = []
    while len(produced) < 10:
        produced += a.step()[0].new_token_ids
    history = prompt + produced
    kv = a.export_kv("r", 0, len(history) - 1)  # [2, L, n-1, H, D]
    assert tuple(kv.shape) == (2, 2, len(history) - 1, 2, 16)
    rest = SamplingParams(temperature=0, max_tokens=24 - len(produced), ignore_eos=True)

    b = make_engine(tiny_dir)
    b.add_request("r", history, rest, computed_kv=kv)
    first = b.step()[0]
    assert first.num_computed_tokens == len(history)  # only the last token was computed here
    assert produced + first.new_token_ids + drain(b)["r"] == reference

    blocks = a.export_cached_blocks(history)
    c = make_engine(tiny_dir)
    assert c.import_cached_blocks(history, blocks) == len(blocks) == (len(history) - 1) // 16
    assert c.cached_prefix_blocks(history) == len(blocks)
    assert produced + c.generate([history], rest)[0].token_ids == reference


def test_prefill_only_engine_feeds_decode_engine(tiny_dir: Path) -> None:
    prompt = prompts(1, length=45)[0]
    reference = run_alone(tiny_dir, prompt)
    prefill = make_engine(tiny_dir, max_num_batched_tokens=16)
    prefill.add_request("p", prompt, GREEDY, prefill_only=True)
    outs = []
    while prefill.has_unfinished_requests():
        outs += prefill.step()
    assert [o.num_computed_tokens for o in outs] == [16, 32, 44]
    assert outs[-1].finished and outs[-1].finish_reason == "prefill" and outs[-1].new_token_ids == []
    kv = prefill.export_kv("p", 0, len(prompt) - 1)
    free_before = prefill.stats().num_free_blocks
    prefill.release("p")
    assert prefill.stats().num_free_blocks == free_before + 3

    decode = make_engine(tiny_dir)
    decode.add_request("p", prompt, GREEDY, computed_kv=kv)
    assert drain(decode)["p"] == reference
    assert decode.stats().num_prompt_tokens_computed == 1


def test_preemption_under_tiny_block_budget_finishes_every_request(tiny_dir: Path) -> None:
    ps = prompts(6, length=18)
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    alone = [run_alone(tiny_dir, p, params) for p in ps]
    engine = make_engine(tiny_dir, num_kv_blocks=10, enable_prefix_caching=False)
    out = engine.generate(ps, params)
    assert [c.token_ids for c in out] == alone
    stats = engine.stats()
    assert stats.num_preemptions > 0
    assert stats.num_free_blocks == 10 and stats.num_running == 0


def test_prompt_longer_than_context_raises_context_length_error(tiny_dir: Path) -> None:
    engine = make_engine(tiny_dir, max_model_len=64)
    with pytest.raises(ContextLengthError) as err:
        engine.add_request("r", [1] * 64, GREEDY)
    assert (err.value.prompt_tokens, err.value.max_model_len) == (64, 64)
    assert isinstance(err.value, ValueError)


def test_generation_stops_at_max_model_len(tiny_dir: Path) -> None:
    engine = make_engine(tiny_dir, max_model_len=32)
    out = engine.generate([[1] * 28], SamplingParams(temperature=0, max_tokens=50, ignore_eos=True))[0]
    assert (len(out.token_ids), out.finish_reason) == (4, "length")


def test_invalid_requests_raise_value_error(tiny_dir: Path) -> None:
    engine = make_engine(tiny_dir)
    engine.add_request("dup", [1, 2, 3], GREEDY)
    with pytest.raises(ValueError, match="already in use"):
        engine.add_request("dup", [1, 2, 3], GREEDY)
    with pytest.raises(ValueError, match="top_p"):
        engine.add_request("bad", [1, 2, 3], SamplingParams(top_p=0.0))
    with pytest.raises(ValueError, match="computed_kv"):
        engine.add_request("kv", [1, 2, 3], GREEDY, computed_kv=torch.zeros(2, 2, 3, 2, 16))


def test_abort_frees_blocks_and_reports_abort(tiny_dir: Path) -> None:
    engine = make_engine(tiny_dir)
    engine.add_request("r", prompts(1)[0], GREEDY)
    engine.step()
    engine.abort_request("r")
    outs = engine.step()
    assert [(o.request_id, o.finished, o.finish_reason) for o in outs] == [("r", True, "abort")]
    assert engine.stats().num_free_blocks == 64 and not engine.has_unfinished_requests()


def test_fully_cached_block_aligned_prompt_recomputes_only_last_token(tiny_dir: Path) -> None:
    prompt = prompts(1, length=32)[0]
    engine = make_engine(tiny_dir)
    cold = engine.generate([prompt], GREEDY)[0].token_ids
    engine.add_request("warm", prompt, GREEDY)
    first = engine.step()[0]
    assert (first.num_cached_tokens, first.num_computed_tokens) == (16, 32)
    assert first.new_token_ids + drain(engine)["warm"] == cold


def test_prefill_only_single_token_prompt_finishes_without_compute(tiny_dir: Path) -> None:
    engine = make_engine(tiny_dir)
    engine.add_request("p", [42], GREEDY, prefill_only=True)
    (out,) = engine.step()
    assert (out.finished, out.finish_reason, out.num_computed_tokens) == (True, "prefill", 0)
    assert tuple(engine.export_kv("p", 0, 0).shape) == (2, 2, 0, 2, 16)
    engine.release("p")
    engine.release("p")  # idempotent
    assert engine.stats().num_free_blocks == 64


def test_kv_events_follow_the_prefix_cache(tiny_dir: Path) -> None:
    engine = make_engine(tiny_dir)
    prompt = prompts(1, length=40)[0]
    engine.generate([prompt], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    hashes = engine.hasher.hashes(prompt)
    assert engine.take_kv_events() == [("stored", hashes[:2], None)]


def test_bfloat16_engine_runs_and_exports_in_model_dtype(tiny_dir: Path) -> None:
    engine = make_engine(tiny_dir, dtype="bfloat16")
    assert engine.dtype == torch.bfloat16 and engine.hasher.dtype == "bfloat16"
    engine.add_request("r", prompts(1)[0], GREEDY)
    engine.step()
    kv = engine.export_kv("r", 0, 16)
    assert kv.dtype == torch.bfloat16 and tuple(kv.shape) == (2, 2, 16, 2, 16)
    assert len(drain(engine)["r"]) == 19


def held_run(engine: LLMEngine, every: int) -> tuple[dict[str, list[int]], dict[str, str], list[list[tuple]]]:
    """Steps `engine` with hold=True, taking what is held every `every` steps: each request's
    tokens and text, and what came out at each step as (request id, tokens, finished)."""
    tokens: dict[str, list[int]] = {}
    texts: dict[str, str] = {}
    sent: list[list[tuple]] = []
    step = 0
    while engine.has_unfinished_requests():
        step += 1
        outs = engine.step(hold=True)
        if step % every == 0:
            outs += engine.take_held()
        sent.append([(o.request_id, o.new_token_ids, o.finished) for o in outs])
        for o in outs:
            tokens.setdefault(o.request_id, []).extend(o.new_token_ids)
            texts[o.request_id] = texts.get(o.request_id, "") + o.new_text
    return tokens, texts, sent


def test_held_steps_keep_tokens_in_the_engine_until_take_held_and_lose_none(tiny_dir: Path) -> None:
    ps = prompts(2)
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, logprobs=2)
    plain = make_engine(tiny_dir).generate(ps, params)
    engine = make_engine(tiny_dir)
    for i, p in enumerate(ps):
        engine.add_request(f"r{i}", p, params)
    tokens, texts, sent = held_run(engine, every=4)
    assert [tokens["r0"], tokens["r1"]] == [c.token_ids for c in plain]
    assert [texts["r0"], texts["r1"]] == [c.text for c in plain]
    assert sent[0] == [("r0", plain[0].token_ids[:1], False), ("r1", plain[1].token_ids[:1], False)]  # first: at once
    assert sent[1] == sent[2] == [] and engine.num_held == 0  # all taken on step 4
    assert [len(t) for _, t, _ in sent[3]] == [3, 3]  # steps 2-4
    assert [(f, len(t)) for _, t, f in sent[9]] == [(True, 2), (True, 2)]  # the end at once, with steps 9-10


def test_a_held_output_keeps_its_logprobs_and_the_latest_counts(tiny_dir: Path) -> None:
    engine = make_engine(tiny_dir)
    engine.add_request("r", prompts(1)[0], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, logprobs=1))
    engine.step(hold=True)
    engine.step(hold=True)
    assert engine.step(hold=True) == [] and engine.num_held == 1
    (out,) = engine.take_held()
    assert len(out.new_token_ids) == len(out.logprobs) == 2 and [lp.token_id for lp in out.logprobs] == out.new_token_ids
    assert (out.num_output_tokens, out.finished) == (3, False) and engine.take_held() == []


def test_an_abort_sends_the_tokens_its_request_held(tiny_dir: Path) -> None:
    engine = make_engine(tiny_dir)
    engine.add_request("r", prompts(1)[0], GREEDY)
    first = engine.step(hold=True)[0].new_token_ids
    engine.step(hold=True)
    engine.step(hold=True)
    engine.abort_request("r")
    (out,) = engine.step(hold=True)
    assert (out.finished, out.finish_reason, len(out.new_token_ids)) == (True, "abort", 2)
    assert first + out.new_token_ids == run_alone(tiny_dir, prompts(1)[0])[:3]
    assert engine.num_held == 0 and engine.take_held() == []
