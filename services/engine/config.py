"""Model architecture parsed from a Hugging Face `config.json` (torch-free)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SUPPORTED_MODEL_TYPES = ("llama", "qwen2")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
_DTYPES = ("float32", "bfloat16", "float16")


class ModelLoadError(Exception):
    """A model directory cannot be loaded; the message names the file and what was expected."""


@dataclass(frozen=True, slots=True)
class ModelArgs:
    model_type: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rope_theta: float
    rope_scaling: dict | None
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool  # bias on q/k/v projections
    torch_dtype: str
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    o_proj_bias: bool = False  # Llama's attention_bias also covers o_proj; Qwen2's does not

    @classmethod
    def from_dir(cls, path: str | Path) -> ModelArgs:
        """Parse `<path>/config.json` (and EOS ids from `generation_config.json` when present)."""
        path = Path(path)
        raw = _read_json(path / "config.json")
        gen_file = path / "generation_config.json"
        gen = _read_json(gen_file) if gen_file.is_file() else {}
        return cls.from_hf_config(raw, gen, source=str(path / "config.json"))

    @classmethod
    def from_hf_config(cls, raw: dict[str, Any], gen: dict[str, Any] | None = None, source: str = "config.json") -> ModelArgs:
        gen = gen or {}
        model_type = raw.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            archs = raw.get("architectures")
            raise ModelLoadError(
                f"{source}: unsupported architecture model_type={model_type!r} (architectures={archs}); "
                f"expected one of {SUPPORTED_MODEL_TYPES} (LlamaForCausalLM, Qwen2ForCausalLM)"
            )
        if raw.get("hidden_act", "silu") != "silu":
            raise ModelLoadError(f"{source}: hidden_act={raw['hidden_act']!r}; expected 'silu'")
        if raw.get("mlp_bias"):
            raise ModelLoadError(f"{source}: mlp_bias=true is not supported; expected false")
        if model_type == "qwen2" and raw.get("use_sliding_window"):
            raise ModelLoadError(f"{source}: use_sliding_window=true is not supported; expected false")
        hidden = _req(raw, "hidden_size", source)
        heads = _req(raw, "num_attention_heads", source)
        head_dim = raw.get("head_dim") or hidden // heads
        rope_theta, rope_scaling = _rope(raw, source)
        dtype = str(raw.get("torch_dtype") or raw.get("dtype") or "float32")
        if dtype not in _DTYPES:
            raise ModelLoadError(f"{source}: torch_dtype={dtype!r}; expected one of {_DTYPES}")
        bias = bool(raw.get("attention_bias", False)) if model_type == "llama" else True
        return cls(
            model_type=model_type,
            vocab_size=_req(raw, "vocab_size", source),
            hidden_size=hidden,
            num_layers=_req(raw, "num_hidden_layers", source),
            num_heads=heads,
            num_kv_heads=raw.get("num_key_value_heads") or heads,
            head_dim=head_dim,
            intermediate_size=_req(raw, "intermediate_size", source),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            attention_bias=bias,
            torch_dtype=dtype,
            bos_token_id=gen.get("bos_token_id", raw.get("bos_token_id")),
            eos_token_ids=_eos_ids(gen.get("eos_token_id"), raw.get("eos_token_id")),
            o_proj_bias=bias and model_type == "llama",
        )

    def kv_block_shape(self, block_size: int) -> tuple[int, int, int, int, int]:
        """Wire layout of one KV block: `[2, num_layers, block_size, num_kv_heads, head_dim]`."""
        return (2, self.num_layers, block_size, self.num_kv_heads, self.head_dim)

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim


def _read_json(file: Path) -> dict[str, Any]:
    if not file.is_file():
        raise ModelLoadError(f"{file}: file not found; expected a Hugging Face-format model directory with this file")
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"{file}: not valid JSON ({exc})") from exc


def _req(raw: dict[str, Any], key: str, source: str) -> int:
    value = raw.get(key)
    if not isinstance(value, int) or value <= 0:
        raise ModelLoadError(f"{source}: missing or invalid {key!r}={value!r}; expected a positive integer")
    return value


def _rope(raw: dict[str, Any], source: str) -> tuple[float, dict | None]:
    # NOTE: transformers>=5 writes `rope_parameters` (theta inside); older configs use
    # `rope_theta` + `rope_scaling`. Both are accepted.
    params = raw.get("rope_parameters") or {}
    scaling = raw.get("rope_scaling") or None
    theta = float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))
    if scaling is None and params.get("rope_type", "default") != "default":
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    if scaling is not None:
        scaling = dict(scaling)
        rope_type = scaling.get("rope_type", scaling.get("type", "default"))
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise ModelLoadError(f"{source}: rope type {rope_type!r} is not supported; expected one of {SUPPORTED_ROPE_TYPES}")
        scaling["rope_type"] = rope_type
        if rope_type == "default":
            scaling = None
    return theta, scaling


def _eos_ids(*candidates: Any) -> tuple[int, ...]:
    for value in candidates:
        if value is None:
            continue
        ids = value if isinstance(value, list) else [value]
        return tuple(int(i) for i in ids)
    return ()
