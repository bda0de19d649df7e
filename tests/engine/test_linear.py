"""CPU packed linears pad a step's rows up to a few counts (linear.py), so the oneDNN kernels they
build per count stay cached: the counts are few, the padding bounded, the output unchanged."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kvmesh.decode.config import DecodeSettings
from kvmesh.engine.linear import ROWS_EXACT, PackedLinear, bucket_rows, packed_linear_works
from kvmesh.engine.llm import EngineConfig, LLMEngine
from kvmesh.engine.sampling import SamplingParams
from kvmesh.worker.settings import engine_config

needs_onednn = pytest.mark.skipif(not packed_linear_works(torch.float32), reason="no oneDNN packed linear in this torch")


def test_small_counts_run_exact_and_larger_ones_pad_at_most_a_quarter() -> None:
    assert [bucket_rows(n) for n in range(1, ROWS_EXACT + 1)] == list(range(1, ROWS_EXACT + 1))
    assert [bucket_rows(n) for n in (17, 20, 21, 33, 100, 257, 2048, 2049)] == [20, 20, 24, 40, 112, 320, 2048, 2560]
    for n in range(1, 5000):
        assert n <= bucket_rows(n) <= 1.25 * n
        assert bucket_rows(bucket_rows(n)) == bucket_rows(n)


def test_every_step_a_worker_can_run_maps_to_few_counts() -> None:
    # max_num_batched_tokens 2048 plus a decode row for each of 64 sequences riding along
    assert len({bucket_rows(n) for n in range(1, 2048 + 64 + 1)}) <= 46


@needs_onednn
@pytest.mark.parametrize("rows", [1, 16, 17, 29, 300, 1000])
def test_padded_rows_give_the_same_output_as_the_exact_count(rows: int) -> None:
    g = torch.Generator().manual_seed(rows)
    w, b = torch.randn(96, 64, generator=g), torch.randn(96, generator=g)
    x = torch.randn(rows, 64, generator=g)
    y = PackedLinear(w, b, bucketed=True)(x)
    assert y.shape == (rows, 96) and y.is_contiguous()
    torch.testing.assert_close(y, PackedLinear(w, b, bucketed=False)(x))
    torch.testing.assert_close(y, F.linear(x, w, b), atol=1e-4, rtol=1e-4)


@needs_onednn
def test_the_engine_generates_the_same_tokens_with_and_without_row_buckets() -> None:
    prompts = [[(7 * i + j) % 250 + 3 for j in range(n)] for i, n in enumerate((5, 23, 150, 411))]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    out = {
        on: [c.token_ids for c in LLMEngine(EngineConfig(model="tiny", cpu_row_buckets=on)).generate(prompts, params)]
        for on in (False, True)
    }
    assert out[True] == out[False]


def test_the_worker_setting_reaches_the_engine_config() -> None:
    assert engine_config(DecodeSettings(model="tiny", nats_url="")).cpu_row_buckets is True
    assert engine_config(DecodeSettings(model="tiny", nats_url="", cpu_row_buckets=False)).cpu_row_buckets is False
