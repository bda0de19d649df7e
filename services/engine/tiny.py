"""The built-in `tiny` model: seeded weights + a byte-level tokenizer, written as an HF-format dir.

Torch-free (numpy + safetensors + tokenizers) so the gateway can resolve it too. It goes through
the same loader as real checkpoints.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

TINY_VERSION = "v1"
TINY_SEED = 1234
SPECIAL_TOKENS = ("<|bos|>", "<|eos|>", "<|pad|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>", "<|reserved|>")
BOS_ID, EOS_ID, END_ID = 256, 257, 262
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
TINY_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 256 + len(SPECIAL_TOKENS),
    "hidden_size": 64,
    "intermediate_size": 192,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "hidden_act": "silu",
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "torch_dtype": "float32",
    "bos_token_id": BOS_ID,
    "eos_token_id": EOS_ID,
}


def default_model_cache() -> Path:
    env = os.environ.get("KVMESH_MODEL_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "kvmesh" / "models"


def resolve_model(name_or_dir: str) -> Path:
    """"tiny" → the built-in model's directory (written on first use); anything else is a path."""
    if name_or_dir == "tiny":
        return ensure_tiny_model()
    return Path(name_or_dir).expanduser()


def ensure_tiny_model(root: Path | None = None) -> Path:
    """Write the tiny model under `root` (default: the model cache) once, atomically; return its dir."""
    root = Path(root) if root is not None else default_model_cache()
    final = root / f"tiny-{TINY_VERSION}"
    if (final / "model.safetensors").is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tiny-", dir=root))
    try:
        write_tiny_model(tmp)
        os.rename(tmp, final)
    except OSError:
        if not (final / "model.safetensors").is_file():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def write_tiny_model(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(TINY_CONFIG, indent=2))
    (path / "generation_config.json").write_text(
        json.dumps({"bos_token_id": BOS_ID, "eos_token_id": [EOS_ID, END_ID]}, indent=2)
    )
    (path / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<|bos|>", "eos_token": "<|eos|>", "pad_token": "<|pad|>", "chat_template": CHAT_TEMPLATE}, indent=2)
    )
    _byte_level_tokenizer().save(str(path / "tokenizer.json"))
    _save_weights(path / "model.safetensors")


def _bytes_to_unicode() -> dict[int, str]:
    # NOTE: GPT-2's printable stand-in for every byte, the alphabet of a ByteLevel tokenizer.
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


def _byte_level_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    vocab = {ch: b for b, ch in _bytes_to_unicode().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    tok.post_processor = processors.TemplateProcessing(single="<|bos|> $A", pair="<|bos|> $A $B", special_tokens=[("<|bos|>", BOS_ID)])
    return tok


def _save_weights(file: Path) -> None:
    import numpy as np
    from safetensors.numpy import save_file

    c = TINY_CONFIG
    rng = np.random.default_rng(TINY_SEED)
    h, inter, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    q, kv = c["num_attention_heads"] * c["head_dim"], c["num_key_value_heads"] * c["head_dim"]

    def normal(shape: tuple[int, ...], std: float):
        return (rng.standard_normal(shape) * std).astype(np.float32)

    # NOTE: larger-than-usual init so greedy argmax is well separated and outputs vary.
    tensors = {"model.embed_tokens.weight": normal((v, h), 1.0), "model.norm.weight": np.ones(h, np.float32)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        tensors |= {
            p + "self_attn.q_proj.weight": normal((q, h), 0.5),
            p + "self_attn.k_proj.weight": normal((kv, h), 0.5),
            p + "self_attn.v_proj.weight": normal((kv, h), 0.5),
            p + "self_attn.o_proj.weight": normal((h, q), 0.5),
            p + "mlp.gate_proj.weight": normal((inter, h), 0.3),
            p + "mlp.up_proj.weight": normal((inter, h), 0.3),
            p + "mlp.down_proj.weight": normal((h, inter), 0.3),
            p + "input_layernorm.weight": np.ones(h, np.float32),
            p + "post_attention_layernorm.weight": np.ones(h, np.float32),
        }
    tensors["lm_head.weight"] = normal((v, h), 0.5)
    save_file(tensors, str(file), metadata={"format": "pt"})
