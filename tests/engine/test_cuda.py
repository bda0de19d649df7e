"""On a CUDA device (skipped elsewhere): graphs vs eager vs the reference, and no host sync in a step.

NOTE: written without a GPU at hand; these have not run yet.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kvmesh.engine.llm import EngineConfig, LLMEngine
from kvmesh.engine.sampling import SamplingParams
from kvmesh.engine.scheduler import ScheduledSeq

pytestmark = pytest.mark.cuda
PROMPTS = [[256, 72, 101, 108, 108, 111], [256] + list(range(40, 90)), [256, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10]]


def engine(tiny_dir: Path, **kw) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(tiny_dir), device="cuda", max_num_seqs=8, **kw))


def test_graphs_eager_and_reference_backends_agree(tiny_dir: Path) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    graphed = engine(tiny_dir)
    assert graphed.runner.graphs is not None and graphed.runner.graphs.graphs
    outs = [e.generate(PROMPTS, params) for e in (graphed, engine(tiny_dir, enforce_eager=True),
                                                   engine(tiny_dir, attention_backend="torch"))]
    assert [c.token_ids for c in outs[0]] == [c.token_ids for c in outs[1]] == [c.token_ids for c in outs[2]]


def test_seeded_sampling_reproducible_on_the_device(tiny_dir: Path) -> None:
    e = engine(tiny_dir)
    seeded = SamplingParams(temperature=1.0, top_p=0.9, seed=5, max_tokens=16, ignore_eos=True)
    alone = e.generate([PROMPTS[0]], seeded)[0].token_ids
    mixed = e.generate(PROMPTS, [SamplingParams(temperature=0.7, max_tokens=9, ignore_eos=True), seeded,
                                 SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)])
    assert mixed[1].token_ids == alone


def test_a_decode_step_does_not_sync_with_the_host(tiny_dir: Path) -> None:
    e = engine(tiny_dir)
    e.add_request("r", PROMPTS[1], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
    e.step()  # prefill
    seq = e._requests["r"].seq
    step = [ScheduledSeq(seq, seq.num_tokens - 1, 1)]  # the prefill allocated the block this position falls in
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        logits = e.runner.execute(step, [True])
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert logits.shape == (1, e.model_args.vocab_size)
