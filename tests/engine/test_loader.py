"""Loader errors name the file and what was expected; ModelArgs parses HF configs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from kvmesh.engine.config import ModelArgs, ModelLoadError
from kvmesh.engine.weights import read_tensors


@pytest.fixture
def model_dir(tiny_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(tiny_dir, tmp_path / "m"))


def test_tiny_config_parses(tiny_dir: Path) -> None:
    args = ModelArgs.from_dir(tiny_dir)
    assert (args.model_type, args.num_layers, args.num_heads, args.num_kv_heads, args.head_dim) == ("llama", 2, 4, 2, 16)
    assert args.eos_token_ids == (257, 262)  # generation_config.json wins over config.json
    assert args.kv_block_shape(16) == (2, 2, 16, 2, 16)


def test_missing_config_names_the_file(model_dir: Path) -> None:
    (model_dir / "config.json").unlink()
    with pytest.raises(ModelLoadError, match=r"config\.json: file not found"):
        ModelArgs.from_dir(model_dir)


def test_missing_weights_names_the_file(model_dir: Path) -> None:
    (model_dir / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match=r"model\.safetensors: file not found; expected model\.safetensors or shards"):
        read_tensors(model_dir, ModelArgs.from_dir(model_dir))


def test_missing_shard_names_the_shard(model_dir: Path) -> None:
    index = {"metadata": {}, "weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors"}}
    (model_dir / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ModelLoadError, match=r"model-00002-of-00002\.safetensors: file not found"):
        read_tensors(model_dir, ModelArgs.from_dir(model_dir))


def test_missing_tokenizer_names_the_file(model_dir: Path) -> None:
    from kvmesh.engine.tokenizer import Tokenizer

    (model_dir / "tokenizer.json").unlink()
    with pytest.raises(ModelLoadError, match=r"tokenizer\.json: file not found"):
        Tokenizer.from_dir(model_dir)


def test_unsupported_architecture_is_rejected(model_dir: Path) -> None:
    cfg = json.loads((model_dir / "config.json").read_text())
    cfg |= {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}
    (model_dir / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match=r"config\.json: unsupported architecture model_type='gpt2'.*expected one of"):
        ModelArgs.from_dir(model_dir)


def test_wrong_tensor_shape_names_tensor_and_expected_shape(model_dir: Path) -> None:
    from safetensors.torch import load_file, save_file

    file = model_dir / "model.safetensors"
    tensors = load_file(str(file))
    tensors["model.layers.1.mlp.down_proj.weight"] = torch.zeros(64, 100)
    save_file(tensors, str(file))
    with pytest.raises(ModelLoadError) as err:
        read_tensors(model_dir, ModelArgs.from_dir(model_dir))
    msg = str(err.value)
    assert "model.safetensors" in msg and "'model.layers.1.mlp.down_proj.weight'" in msg
    assert "shape (64, 100); expected (64, 192)" in msg


def test_missing_tensor_is_reported(model_dir: Path) -> None:
    from safetensors.torch import load_file, save_file

    file = model_dir / "model.safetensors"
    tensors = load_file(str(file))
    del tensors["lm_head.weight"]
    save_file(tensors, str(file))
    with pytest.raises(ModelLoadError, match=r"missing 1 tensor\(s\), e\.g\. 'lm_head\.weight' with shape \(264, 64\)"):
        read_tensors(model_dir, ModelArgs.from_dir(model_dir))


def test_unsupported_rope_type_is_rejected() -> None:
    raw = {"model_type": "llama", "vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
           "intermediate_size": 16, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}
    with pytest.raises(ModelLoadError, match="rope type 'yarn' is not supported"):
        ModelArgs.from_hf_config(raw)


def test_legacy_rope_fields_and_qwen2_bias() -> None:
    raw = {"model_type": "qwen2", "vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
           "num_key_value_heads": 1, "intermediate_size": 16, "rope_theta": 1e6, "torch_dtype": "bfloat16", "eos_token_id": 3}
    args = ModelArgs.from_hf_config(raw)
    assert (args.rope_theta, args.rope_scaling, args.attention_bias, args.o_proj_bias) == (1e6, None, True, False)
    assert (args.head_dim, args.torch_dtype, args.eos_token_ids) == (4, "bfloat16", (3,))
