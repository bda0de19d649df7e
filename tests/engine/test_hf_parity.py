"""Our model's logits and greedy outputs match transformers on the same random weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kvmesh.engine.config import ModelArgs
from kvmesh.engine.runner import ModelRunner
from kvmesh.engine.scheduler import ScheduledSeq
from kvmesh.engine.sampling import SamplingParams
from kvmesh.engine.sequence import Sequence
from .hf_models import CONFIGS, build_hf_model, save_hf_model

PROMPT = [5, 17, 250, 3, 99, 42, 7, 311, 64, 128, 1, 2, 200, 33, 18, 77, 19, 260, 45, 8]


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def hf_pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, tiny_dir: Path):
    model = build_hf_model(request.param)
    shard = "200KB" if request.param == "llama_gqa" else None  # one sharded checkpoint with an index json
    path = save_hf_model(model, tmp_path_factory.mktemp(request.param), tiny_dir, max_shard_size=shard)
    return request.param, model, path


def _our_logits(path: Path, tokens: list[int]) -> torch.Tensor:
    args = ModelArgs.from_dir(path)
    runner = ModelRunner(path, args, torch.float32, torch.device("cpu"), num_blocks=8, block_size=16, max_len=512)
    seq = Sequence("r", list(tokens), len(tokens), SamplingParams())
    seq.block_table = list(range(-(-len(tokens) // 16)))
    return runner.execute([ScheduledSeq(seq, 0, len(tokens))], [True], all_logits=True)  # [T, V]


def test_logits_match_transformers(hf_pair) -> None:
    name, model, path = hf_pair
    with torch.inference_mode():
        ref = model(torch.tensor([PROMPT])).logits[0]  # [T, V]
    ours = _our_logits(path, PROMPT)
    torch.testing.assert_close(ours, ref, atol=2e-4, rtol=1e-4)


def test_greedy_32_tokens_match_transformers(hf_pair) -> None:
    from kvmesh.engine.llm import EngineConfig, LLMEngine

    name, model, path = hf_pair
    with torch.inference_mode():
        ref = model.generate(torch.tensor([PROMPT]), max_new_tokens=32, do_sample=False, eos_token_id=None,
                             pad_token_id=0)[0, len(PROMPT):].tolist()
    # NOTE: a small token budget forces chunked prefill (8-token chunks) before decoding.
    engine = LLMEngine(EngineConfig(model=str(path), num_kv_blocks=16, max_num_batched_tokens=8))
    out = engine.generate([PROMPT], SamplingParams(temperature=0, max_tokens=32, ignore_eos=True))[0]
    assert out.token_ids == ref
    assert out.finish_reason == "length"


def test_checkpoint_layout_and_parsed_config(hf_pair) -> None:
    name, _, path = hf_pair
    args = ModelArgs.from_dir(path)
    sharded = (path / "model.safetensors.index.json").is_file()
    assert sharded == (name == "llama_gqa")
    assert len(list(path.glob("*.safetensors"))) > 1 if sharded else (path / "model.safetensors").is_file()
    assert args.tie_word_embeddings == name.endswith("tied")
    assert (args.rope_scaling or {}).get("rope_type") == ("llama3" if name == "llama3_tied" else None)
    assert args.attention_bias == name.startswith("qwen2")


@pytest.mark.cuda
def test_cuda_bf16_greedy_runs(hf_pair) -> None:
    from kvmesh.engine.llm import EngineConfig, LLMEngine

    _, _, path = hf_pair
    engine = LLMEngine(EngineConfig(model=str(path), device="cuda", dtype="bfloat16", num_kv_blocks=16))
    out = engine.generate([PROMPT], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))[0]
    assert len(out.token_ids) == 8
