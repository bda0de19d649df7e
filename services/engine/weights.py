"""Load a Hugging Face safetensors checkpoint (single file or sharded) into a `LlamaModel`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from kvmesh.engine.config import ModelArgs, ModelLoadError
from kvmesh.engine.linear import Linear, make_linear, packed_linear_works
from kvmesh.engine.model import LayerWeights, LlamaModel

INDEX_FILE = "model.safetensors.index.json"


def expected_shapes(args: ModelArgs) -> dict[str, tuple[int, ...]]:
    """Every tensor name the checkpoint must hold, with its shape."""
    h, inter = args.hidden_size, args.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (args.vocab_size, h), "model.norm.weight": (h,)}
    if not args.tie_word_embeddings:
        shapes["lm_head.weight"] = (args.vocab_size, h)
    for i in range(args.num_layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "self_attn.q_proj.weight": (args.q_size, h),
            p + "self_attn.k_proj.weight": (args.kv_size, h),
            p + "self_attn.v_proj.weight": (args.kv_size, h),
            p + "self_attn.o_proj.weight": (h, args.q_size),
            p + "mlp.gate_proj.weight": (inter, h),
            p + "mlp.up_proj.weight": (inter, h),
            p + "mlp.down_proj.weight": (h, inter),
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
        }
        if args.attention_bias:
            shapes |= {p + "self_attn.q_proj.bias": (args.q_size,), p + "self_attn.k_proj.bias": (args.kv_size,)}
            shapes[p + "self_attn.v_proj.bias"] = (args.kv_size,)
        if args.o_proj_bias:
            shapes[p + "self_attn.o_proj.bias"] = (h,)
    return shapes


def checkpoint_files(path: Path) -> list[Path]:
    index = path / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ModelLoadError(f"{index}: expected JSON with a 'weight_map' object ({exc})") from exc
        files = [path / name for name in sorted(set(weight_map.values()))]
        for file in files:
            if not file.is_file():
                raise ModelLoadError(f"{file}: file not found; {index.name} lists it as a checkpoint shard")
        return files
    single = path / "model.safetensors"
    if single.is_file():
        return [single]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{single}: file not found; expected model.safetensors or shards with {INDEX_FILE}")
    return files


def read_tensors(path: Path, args: ModelArgs) -> dict[str, torch.Tensor]:
    """Read and shape-check every expected tensor (on CPU, checkpoint dtype)."""
    from safetensors import safe_open

    want = expected_shapes(args)
    found: dict[str, torch.Tensor] = {}
    for file in checkpoint_files(path):
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():
                if name not in want:
                    continue
                tensor = f.get_tensor(name)
                if tuple(tensor.shape) != want[name]:
                    raise ModelLoadError(
                        f"{file}: tensor {name!r} has shape {tuple(tensor.shape)}; expected {want[name]} "
                        f"from config.json"
                    )
                found[name] = tensor
    missing = [n for n in want if n not in found]
    if missing:
        raise ModelLoadError(
            f"{path}: checkpoint is missing {len(missing)} tensor(s), e.g. {missing[0]!r} with shape "
            f"{want[missing[0]]}; expected by config.json"
        )
    return found


def load_model(
    path: Path, args: ModelArgs, dtype: torch.dtype, device: torch.device, max_len: int, attention: Any,
    row_buckets: bool = True,
) -> LlamaModel:
    """The model on `device` in `dtype`, attending through the backend `attention` (see attention.py);
    `row_buckets`: CPU packed linears pad their rows to a few counts (linear.py)."""
    raw = read_tensors(path, args)

    def get(name: str) -> torch.Tensor:
        return raw[name].to(device=device, dtype=dtype)

    def cat(*names: str) -> torch.Tensor:
        return torch.cat([raw[n] for n in names]).to(device=device, dtype=dtype)

    packed = device.type == "cpu" and packed_linear_works(dtype)

    def linear(weight: torch.Tensor, bias: torch.Tensor | None = None) -> Linear:
        return make_linear(weight, bias, packed, row_buckets)

    layers = []
    for i in range(args.num_layers):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        layers.append(
            LayerWeights(
                input_norm=get(p + "input_layernorm.weight"),
                qkv=linear(
                    cat(a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"),
                    cat(a + "q_proj.bias", a + "k_proj.bias", a + "v_proj.bias") if args.attention_bias else None,
                ),
                o=linear(get(a + "o_proj.weight"), get(a + "o_proj.bias") if args.o_proj_bias else None),
                post_norm=get(p + "post_attention_layernorm.weight"),
                gate_up=linear(cat(p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight")),
                down=linear(get(p + "mlp.down_proj.weight")),
            )
        )
    embed = get("model.embed_tokens.weight")
    lm_head = linear(embed if args.tie_word_embeddings else get("lm_head.weight"))
    return LlamaModel(args, embed, layers, get("model.norm.weight"), lm_head, max_len, attention)
