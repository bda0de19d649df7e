"""Llama-family decoder (Llama 2/3, Qwen2/2.5) in plain torch, attending over a paged KV cache.

The forward pass works on a flat batch of T tokens from many sequences. Attention goes through
an attention backend (`attention.py`: gather + SDPA on CPU, Triton kernels on CUDA) with metadata
built once per step by the model runner, so there is no per-sequence Python work inside a layer,
and nothing in `forward` syncs with the host (a decode step can be captured in a CUDA graph).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from kvmesh.engine.config import ModelArgs
from kvmesh.engine.linear import Linear


@dataclass(slots=True)
class ForwardBatch:
    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    slot_mapping: torch.Tensor  # [T] cache slot each new token's K/V is written to (-1: padding, Triton only)
    attn: Any  # the attention backend's metadata for this step
    logits_index: torch.Tensor | None  # [S] flat rows whose next-token logits are needed (None: every row)


@dataclass(slots=True)
class LayerWeights:
    input_norm: torch.Tensor  # [hidden]
    qkv: Linear  # hidden → q_size + 2*kv_size
    o: Linear  # q_size → hidden
    post_norm: torch.Tensor  # [hidden]
    gate_up: Linear  # hidden → 2*intermediate
    down: Linear  # intermediate → hidden


def rope_inv_freq(args: ModelArgs) -> torch.Tensor:
    """Inverse frequencies [head_dim/2] (fp32), with linear or Llama-3 scaling applied."""
    dim = args.head_dim
    inv_freq = 1.0 / (args.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    scaling = args.rope_scaling or {}
    kind = scaling.get("rope_type", "default")
    if kind == "linear":
        return inv_freq / float(scaling["factor"])
    if kind != "llama3":
        return inv_freq
    factor = float(scaling["factor"])
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    old_len = float(scaling["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return torch.where(is_medium, smoothed, scaled)


def rope_tables(args: ModelArgs, max_len: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and signed sin tables [max_len, head_dim] in the model dtype.

    The sin table carries the sign of rotate_half (`[-sin, sin]`), saving a negation per call.
    """
    pos = torch.arange(max_len, dtype=torch.float32)
    freqs = pos[:, None] * rope_inv_freq(args)[None, :]  # [P, D/2]
    cos, sin = freqs.cos(), freqs.sin()
    cos_t = torch.cat((cos, cos), dim=-1)  # [P, D]
    sin_t = torch.cat((-sin, sin), dim=-1)  # [P, D]
    return cos_t.to(dtype=dtype, device=device), sin_t.to(dtype=dtype, device=device)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    # x: [T, H, D]; cos/signed_sin: [T, 1, D]
    half = x.shape[-1] // 2
    swapped = torch.cat((x[..., half:], x[..., :half]), dim=-1)  # [T, H, D]
    return torch.addcmul(x * cos, swapped, signed_sin)


class LlamaModel:
    def __init__(
        self,
        args: ModelArgs,
        embed: torch.Tensor,
        layers: list[LayerWeights],
        norm: torch.Tensor,
        lm_head: Linear,
        max_len: int,
        attention: Any,
    ) -> None:
        self.args = args
        self.attention = attention  # an attention backend (see attention.py)
        self.embed = embed  # [V, hidden]
        self.layers = layers
        self.norm = norm
        self.lm_head = lm_head  # hidden → V (the embedding's weight when tied)
        self.cos, self.sin = rope_tables(args, max_len, embed.dtype, embed.device)
        self._num_qk_heads = args.num_heads + args.num_kv_heads

    def _rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        # NOTE: normalise in fp32 like the reference implementation, scale in the model dtype.
        if x.dtype == torch.float32:
            return F.rms_norm(x, weight.shape, weight, self.args.rms_norm_eps)
        return weight * F.rms_norm(x.float(), weight.shape, eps=self.args.rms_norm_eps).to(x.dtype)

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, kv_cache: torch.Tensor) -> torch.Tensor:
        """Run the flat batch, write its K/V into `kv_cache` [2, L, slots, Hkv, D]; return logits [S, V]."""
        a = self.args
        t = batch.input_ids.shape[0]
        x = F.embedding(batch.input_ids, self.embed)  # [T, hidden]
        cos = self.cos.index_select(0, batch.positions).unsqueeze(1)  # [T, 1, D]
        sin = self.sin.index_select(0, batch.positions).unsqueeze(1)
        for i, w in enumerate(self.layers):
            h = self._rms_norm(x, w.input_norm)
            qkv = w.qkv(h).view(t, self._num_qk_heads + a.num_kv_heads, a.head_dim)  # [T, Hq+2Hkv, D]
            qk = apply_rope(qkv[:, : self._num_qk_heads], cos, sin)  # [T, Hq+Hkv, D], q and k together
            q = qk[:, : a.num_heads]  # [T, Hq, D]
            k_cache, v_cache = kv_cache[0, i], kv_cache[1, i]  # [slots, Hkv, D]
            self.attention.write_kv(qk[:, a.num_heads :], qkv[:, self._num_qk_heads :], k_cache, v_cache, batch.slot_mapping)
            attn = self.attention.forward(q, k_cache, v_cache, batch.attn)  # [T, Hq*D]
            x = x + w.o(attn)
            gate, up = w.gate_up(self._rms_norm(x, w.post_norm)).chunk(2, dim=-1)  # [T, I] each
            x = x + w.down(F.silu(gate) * up)
        if batch.logits_index is not None:
            x = x.index_select(0, batch.logits_index)  # [S, hidden]
        x = self._rms_norm(x, self.norm)
        return self.lm_head(x)  # [S, V]
