"""Tiny random Llama/Qwen2 checkpoints built with transformers' own classes (test helper)."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

COMMON = dict(
    vocab_size=320, hidden_size=64, intermediate_size=160, num_hidden_layers=2, max_position_embeddings=512,
    bos_token_id=None, eos_token_id=None, pad_token_id=None, initializer_range=0.2,
)
CONFIGS: dict[str, dict] = {
    "llama_gqa": dict(arch="llama", num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False),
    "llama3_tied": dict(
        arch="llama", num_attention_heads=4, num_key_value_heads=1, tie_word_embeddings=True, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 64},
    ),
    "qwen2_gqa": dict(arch="qwen2", num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False),
    "qwen2_tied": dict(arch="qwen2", num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=True,
                       rope_theta=1000000.0),
}


def build_hf_model(name: str, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    spec = dict(CONFIGS[name])
    arch = spec.pop("arch")
    cfg_cls, model_cls = (LlamaConfig, LlamaForCausalLM) if arch == "llama" else (Qwen2Config, Qwen2ForCausalLM)
    config = cfg_cls(**COMMON, **spec)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    # NOTE: norms start at 1.0; perturb them so a wrong norm weight would show up.
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n or n.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    return model


def save_hf_model(model, path: Path, tokenizer_from: Path, max_shard_size: str | None = None) -> Path:
    """save_pretrained (safetensors) plus the tiny model's byte-level tokenizer files."""
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(str(path), **kwargs)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_from / name, path / name)
    return path
