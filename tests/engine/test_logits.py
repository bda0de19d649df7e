"""Logits processors against hand-computed values (vLLM's definitions)."""

from __future__ import annotations

import pytest
import torch

from kvmesh.engine.logits import apply_logits_processors
from kvmesh.engine.sampling import SamplingParams

INF = float("-inf")


def run(logits: list[list[float]], params: list[SamplingParams], tokens: list[list[int]], prompt: list[int], eos=frozenset({4})):
    return apply_logits_processors(torch.tensor(logits), params, tokens, prompt, eos).tolist()


def test_nothing_to_do_returns_the_same_tensor() -> None:
    logits = torch.zeros(2, 5)
    assert apply_logits_processors(logits, [SamplingParams(), SamplingParams()], [[1], [2]], [1, 1], frozenset()) is logits


def test_repetition_penalty_divides_positive_and_multiplies_negative_seen_logits() -> None:
    # prompt [0], output [1]: both seen; 2 and 3 unseen.
    out = run([[2.0, -1.0, 3.0, -4.0, 0.0]], [SamplingParams(repetition_penalty=2.0)], [[0, 1]], [1])
    assert out == [[1.0, -2.0, 3.0, -4.0, 0.0]]


def test_frequency_and_presence_penalties_count_output_tokens_only() -> None:
    # prompt [3, 3]; output [1, 1, 2]: counts 1 -> 2, 2 -> 1; the prompt's 3 is not penalized.
    p = SamplingParams(frequency_penalty=0.5, presence_penalty=0.25)
    out = run([[1.0, 1.0, 1.0, 1.0, 1.0]], [p], [[3, 3, 1, 1, 2]], [2])
    assert out == [[1.0, 1.0 - 2 * 0.5 - 0.25, 1.0 - 0.5 - 0.25, 1.0, 1.0]]


def test_logit_bias_adds_and_min_tokens_masks_stops_until_reached() -> None:
    p = SamplingParams(logit_bias=((0, 100.0), (2, -3.0)), min_tokens=2, stop_token_ids=(3,))
    out = run([[0.0, 0.0, 1.0, 1.0, 1.0], [0.0] * 5], [p, SamplingParams(min_tokens=1)], [[9, 7], [9, 7]], [1, 1])
    # row 0: one output token < 2 -> EOS (4) and stop id 3 masked; row 1 already has 1 token.
    assert out == [[100.0, 0.0, -2.0, INF, INF], [0.0] * 5]


def test_a_row_left_without_tokens_keeps_its_input() -> None:
    # min_tokens hides the only token the row had: fall back to the logits as given.
    out = run([[INF, INF, INF, INF, 1.0]], [SamplingParams(min_tokens=3)], [[0]], [1])
    assert out == [[INF, INF, INF, INF, 1.0]]


def test_rows_are_independent_in_one_batch() -> None:
    params = [SamplingParams(), SamplingParams(presence_penalty=1.0), SamplingParams(repetition_penalty=0.5)]
    out = run([[1.0] * 5, [1.0] * 5, [1.0] * 5], params, [[0, 1], [0, 1], [0, 1]], [1, 1, 1])
    assert out == [[1.0] * 5, [1.0, 0.0, 1.0, 1.0, 1.0], [2.0, 2.0, 1.0, 1.0, 1.0]]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_same_result_on_cuda() -> None:
    params = [SamplingParams(presence_penalty=0.5, repetition_penalty=1.3, logit_bias=((2, 1.0),))]
    logits = torch.randn(1, 50)
    cpu = apply_logits_processors(logits, params, [[1, 2, 3, 2]], [2], frozenset({0}))
    gpu = apply_logits_processors(logits.cuda(), params, [[1, 2, 3, 2]], [2], frozenset({0}))
    assert torch.allclose(cpu, gpu.cpu())
