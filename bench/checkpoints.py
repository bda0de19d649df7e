"""Random-weight HF checkpoints for benchmarks (nothing is downloaded)."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from kvmesh.engine.tiny import ensure_tiny_model

# ~20M parameters: big enough that compute, not Python overhead, dominates on CPU.
SMALL_LLAMA = dict(
    vocab_size=32000, hidden_size=384, intermediate_size=1024, num_hidden_layers=6, num_attention_heads=6,
    num_key_value_heads=2, max_position_embeddings=2048, tie_word_embeddings=True,
    bos_token_id=None, eos_token_id=None, pad_token_id=None,
)


# The same size with the tiny model's byte-level vocabulary, so every generated token decodes to
# text (streaming benchmarks time the first text chunk).
SMALL_LLAMA_BYTES = dict(SMALL_LLAMA, vocab_size=264, hidden_size=512, intermediate_size=1408,
                         num_hidden_layers=8, num_attention_heads=8)


def build_llama(root: Path, name: str = "bench-llama", **overrides):
    """Saves a seeded random LlamaForCausalLM (safetensors + the tiny model's tokenizer files) under
    root/name; returns (the transformers model, its directory)."""
    from transformers import LlamaConfig, LlamaForCausalLM  # noqa: PLC0415

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**{**SMALL_LLAMA, **overrides})).eval()
    return model, save_checkpoint(model, root, name)


def save_checkpoint(model, root: Path, name: str) -> Path:
    """save_pretrained (safetensors) under root/name plus the tiny model's tokenizer files."""
    path = root / name
    model.save_pretrained(str(path))
    tiny = ensure_tiny_model(root / "cache")
    for file in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny / file, path / file)
    return path
