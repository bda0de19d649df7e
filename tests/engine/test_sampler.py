"""The vectorized sampler: greedy, seeded draws independent of the batch, filters, distribution."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kvmesh.engine.llm import EngineConfig, LLMEngine
from kvmesh.engine.sampler import Sampler, row_uniform, sample_rows
from kvmesh.engine.sampling import SamplingParams

CHI2_DF7_P001 = 24.322  # chi-square critical value, 7 degrees of freedom, p = 0.001


def random_logits(rows: int, vocab: int, seed: int) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3  # [S, V]


def test_greedy_is_argmax() -> None:
    logits = random_logits(16, 1000, 0)
    tokens, logprobs = Sampler()(logits, [SamplingParams(temperature=0.0)] * 16, [0] * 16, [0] * 16)
    assert tokens == logits.argmax(dim=-1).tolist()
    assert logprobs == [None] * 16


def test_seeded_row_same_alone_and_in_a_mixed_batch() -> None:
    logits = random_logits(5, 300, 1)
    seeded = SamplingParams(temperature=0.8, top_p=0.9, seed=42)
    alone, _ = Sampler()(logits[2:3], [seeded], [42], [7])
    mixed_params = [SamplingParams(temperature=0.0), SamplingParams(top_k=3), seeded, SamplingParams(min_p=0.2),
                    SamplingParams(temperature=1.5, logprobs=2)]
    mixed, _ = Sampler()(logits, mixed_params, [1, 2, 42, 3, 4], [0, 5, 7, 9, 1])
    assert mixed[2] == alone[0]


def test_seeded_request_same_tokens_alone_and_in_a_mixed_batch_through_the_engine(tiny_dir: Path) -> None:
    engine = LLMEngine(EngineConfig(model=str(tiny_dir), num_kv_blocks=64))
    seeded = SamplingParams(temperature=1.0, top_k=40, seed=11, max_tokens=12, ignore_eos=True)
    prompt = [256, 72, 101, 108, 108, 111]
    alone = engine.generate([prompt], seeded)[0].token_ids
    others = [SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True),
              SamplingParams(temperature=1.3, max_tokens=20, ignore_eos=True),
              SamplingParams(temperature=0.7, top_p=0.5, seed=3, max_tokens=9, ignore_eos=True)]
    batch = engine.generate([[256, 1, 2, 3], [256, 9] * 10, prompt, [256, 50, 60]], [others[0], others[1], seeded, others[2]])
    assert batch[2].token_ids == alone


@pytest.mark.parametrize("params", [
    SamplingParams(top_k=5), SamplingParams(top_p=0.5), SamplingParams(min_p=0.3),
    SamplingParams(temperature=2.0, top_k=20, top_p=0.8, min_p=0.05),
], ids=["top_k", "top_p", "min_p", "all"])
def test_filters_only_pick_allowed_tokens(params: SamplingParams) -> None:
    logits = random_logits(1, 200, 2)[0] / params.temperature  # [V]
    probs = torch.softmax(logits, dim=-1)
    sorted_p, order = torch.sort(probs, descending=True)
    k = params.top_k or 200
    kept = sorted_p[:k] / sorted_p[:k].sum()
    n_top_p = int(((torch.cumsum(kept, 0) - kept) < params.top_p).sum())
    allowed = {t for t in order[:n_top_p].tolist() if probs[t] >= params.min_p * probs.max()}
    rows = 400
    picked = sample_rows(logits.repeat(rows, 1) * params.temperature, [params] * rows, [row_uniform(9, s) for s in range(rows)])
    assert set(picked.tolist()) <= allowed
    assert len(set(picked.tolist())) > 1  # it does sample, not collapse to one token


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.7), SamplingParams(temperature=1.0, top_k=8, top_p=0.999)],
                         ids=["temperature", "sorted-path"])
def test_distribution_matches_softmax_chi_square(params: SamplingParams) -> None:
    logits = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -2.0])  # V = 8, df = 7
    draws = 20000
    picked = sample_rows(logits.repeat(draws, 1), [params] * draws, [row_uniform(2024, s) for s in range(draws)])
    counts = torch.bincount(picked, minlength=8).double()
    probs = torch.softmax(logits.double() / params.temperature, dim=-1)
    stat = chi_square(counts, probs)
    print(f"chi-square {stat:.2f} (df 7, critical {CHI2_DF7_P001} at p=0.001)")
    assert stat < CHI2_DF7_P001


def test_wrong_distribution_fails_the_chi_square() -> None:
    """The statistic has power: draws at temperature 1.0 do not pass as temperature 0.7."""
    logits = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -2.0])
    picked = sample_rows(logits.repeat(20000, 1), [SamplingParams()] * 20000, [row_uniform(2024, s) for s in range(20000)])
    counts = torch.bincount(picked, minlength=8).double()
    assert chi_square(counts, torch.softmax(logits.double() / 0.7, dim=-1)) > CHI2_DF7_P001


def test_logprobs_are_the_raw_distribution_and_top_n() -> None:
    logits = random_logits(3, 50, 4)
    params = [SamplingParams(temperature=0.0, logprobs=3), SamplingParams(temperature=0.0), SamplingParams(seed=1, logprobs=0)]
    tokens, logprobs = Sampler()(logits, params, [0, 0, 1], [0, 0, 0])
    ref = torch.log_softmax(logits, dim=-1)
    top = torch.topk(ref[0], 3)
    assert logprobs[0].token_id == tokens[0] and logprobs[0].logprob == pytest.approx(float(ref[0, tokens[0]]), abs=1e-6)
    assert [t for t, _ in logprobs[0].top_logprobs] == top.indices.tolist()
    assert [v for _, v in logprobs[0].top_logprobs] == pytest.approx(top.values.tolist(), abs=1e-6)
    assert logprobs[1] is None
    assert logprobs[2].top_logprobs == [] and logprobs[2].logprob == pytest.approx(float(ref[2, tokens[2]]), abs=1e-6)


def test_logits_processors_run_before_sampling() -> None:
    logits = random_logits(2, 20, 5)
    best = logits.argmax(dim=-1)

    def ban_best(x: torch.Tensor, params) -> torch.Tensor:
        return x.scatter(1, best.unsqueeze(1), float("-inf"))

    params = [SamplingParams(temperature=0.0, logprobs=0), SamplingParams(seed=3)]
    tokens, logprobs = Sampler([ban_best])(logits, params, [0, 3], [0, 0])
    assert tokens[0] == int(logits[0].clone().scatter(0, best[0:1], float("-inf")).argmax())
    assert tokens[1] != int(best[1])
    assert logprobs[0].logprob == pytest.approx(float(torch.log_softmax(logits[0], -1)[tokens[0]]), abs=1e-6)


def test_row_uniform_is_in_the_open_unit_interval_and_keyed_by_seed_and_step() -> None:
    draws = [row_uniform(seed, step) for seed in (0, 1, 2**62) for step in range(200)]
    assert all(0.0 < u < 1.0 for u in draws)
    assert row_uniform(5, 3) == row_uniform(5, 3) != row_uniform(5, 4) != row_uniform(6, 3)
    assert 0.45 < sum(draws) / len(draws) < 0.55
