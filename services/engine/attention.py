"""Attention backends over the paged KV cache, chosen by device.

A backend does three things for the model:
- `build(layout, staging)`: host-side metadata for one step (adds its integer arrays to the
  step's `Staging`, so every input reaches the device in one copy), returning a function that
  turns the uploaded tensors into the backend's metadata;
- `write_kv(k, v, k_cache, v_cache, slot_mapping)`: store the new tokens' K/V in their slots;
- `forward(q, k_cache, v_cache, meta)`: attention output [T, Hq*D] for the flat batch.

`TorchAttention` (gather the context with `index_select`, then SDPA with a mask) is the reference
and the CPU backend; `TritonAttention` (kernels in `triton_kernels.py`) is the CUDA backend.
`attention_backend="auto"` picks Triton on CUDA and torch elsewhere; either can be forced.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from kvmesh.engine.config import ModelArgs
from kvmesh.engine.staging import Staging

BACKENDS = ("auto", "torch", "triton")


@dataclass(slots=True)
class BatchLayout:
    """The rows of one step in flat-batch order: decode rows (one new token each) first."""

    starts: list[int]  # tokens of each row already in the cache
    num_new: list[int]  # new tokens of each row this step
    block_tables: torch.Tensor  # [B, W] int64 on the host, padded with block 0 to the widest row
    num_decode: int

    @staticmethod
    def pad_tables(tables: list[list[int]]) -> torch.Tensor:
        w = max(len(t) for t in tables)
        return torch.tensor([t + [0] * (w - len(t)) for t in tables], dtype=torch.long)  # [B, W]


def resolve_backend(name: str, device: torch.device) -> str:
    if name not in BACKENDS:
        raise ValueError(f"attention_backend must be one of {BACKENDS}, got {name!r}")
    if name == "auto":
        return "triton" if device.type == "cuda" else "torch"
    return name


def make_backend(name: str, args: ModelArgs, block_size: int, device: torch.device) -> Any:
    """The attention backend `name` (after `resolve_backend`) for this model."""
    if resolve_backend(name, device) == "triton":
        from kvmesh.engine.attention_triton import TritonAttention  # noqa: PLC0415 - triton only when used

        return TritonAttention(args, block_size)
    return TorchAttention(args, block_size)


@dataclass(slots=True)
class AttentionGroup:
    """Rows of the flat batch attended together (tokens `start:end` of the flat batch)."""

    start: int
    end: int
    num_rows: int  # B
    context_len: int  # C, the padded context length
    kv_slots: torch.Tensor  # [B*C] cache slots of each row's context, row-major (padding → any slot, masked)
    mask: torch.Tensor  # [B, 1, Q, C] bool, True = attend
    q_index: torch.Tensor | None  # [B*Q] flat token index per query (None: decode, one query per row, in order)
    out_index: torch.Tensor | None  # [end-start] rows of the [B*Q] output that are real tokens
    single: bool = False  # one prefill row: its queries are tokens start:end in order; mask None = plain causal


class TorchAttention:
    """Reference backend: gather each row's context, padded to the longest, then masked SDPA."""

    name = "torch"

    def __init__(self, args: ModelArgs, block_size: int) -> None:
        self.args = args
        self.block_size = block_size

    def build(self, layout: BatchLayout, staging: Staging) -> Callable[[dict[str, torch.Tensor]], list[AttentionGroup]]:
        bt = layout.block_tables  # [B, W]
        n_dec = layout.num_decode
        groups = []
        if n_dec:
            groups.append(self._decode_group(layout.starts[:n_dec], bt[:n_dec], staging.device))
        if n_dec < len(layout.starts):
            groups.append(self._prefill_group(layout.starts[n_dec:], layout.num_new[n_dec:], bt[n_dec:], n_dec, staging.device))
        return lambda uploaded: groups

    def _context_slots(self, bt: torch.Tensor, ctx: int) -> torch.Tensor:
        pos = torch.arange(ctx)
        return (bt[:, pos // self.block_size] * self.block_size + pos % self.block_size).flatten()  # [B*C]

    def _decode_group(self, starts: list[int], bt: torch.Tensor, dev: torch.device) -> AttentionGroup:
        ctx = torch.tensor(starts) + 1  # [B]
        c = int(ctx.max())
        mask = (torch.arange(c)[None, :] < ctx[:, None])[:, None, None, :]  # [B, 1, 1, C]
        return AttentionGroup(0, len(starts), len(starts), c, self._context_slots(bt, c).to(dev), mask.to(dev), None, None)

    def _prefill_group(self, starts: list[int], num_new: list[int], bt: torch.Tensor, offset: int, dev: torch.device) -> AttentionGroup:
        if len(starts) == 1:
            return self._prefill_one(starts[0], num_new[0], bt, offset, dev)
        n = torch.tensor(num_new)  # [B]
        start = torch.tensor(starts)  # [B]
        q_len, c = int(n.max()), int((start + n).max())
        j = torch.arange(q_len)[None, :]  # [1, Q]
        first = offset + torch.cumsum(n, 0) - n  # [B] flat index of each row's first token
        j_clamped = torch.minimum(j, (n - 1)[:, None])  # [B, Q]; padded queries repeat the last token
        q_index = first[:, None] + j_clamped  # [B, Q]
        q_pos = start[:, None] + j_clamped  # [B, Q]
        mask = (torch.arange(c)[None, None, :] <= q_pos[:, :, None])[:, None]  # [B, 1, Q, C]
        out_index = (torch.arange(len(starts))[:, None] * q_len + j)[j < n[:, None]]  # [T_prefill]
        total = int(n.sum())
        return AttentionGroup(
            offset, offset + total, len(starts), c, self._context_slots(bt, c).to(dev), mask.to(dev),
            q_index.flatten().to(dev), out_index.to(dev),
        )

    def _prefill_one(self, start: int, n: int, bt: torch.Tensor, offset: int, dev: torch.device) -> AttentionGroup:
        """One prefill row (a continuous batch's usual case: a request joins running decodes):
        no padding, so no query or output gather, and with nothing cached before it a plain causal
        mask SDPA makes itself. NOTE: a step with one prompt mixed into 32 decode rows cost ~0.5 ms
        more than the decode rows alone on `tiny` (CPU), ~0.2 ms of it the padded group's build."""
        c = start + n
        mask = None if start == 0 else (torch.arange(c)[None, :] <= torch.arange(start, c)[:, None])[None, None].to(dev)
        return AttentionGroup(offset, offset + n, 1, c, self._context_slots(bt, c).to(dev), mask, None, None, single=True)

    def write_kv(self, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        # k, v: [T, Hkv, D]; caches [slots, Hkv, D]; slot_mapping [T]
        k_cache.index_copy_(0, slot_mapping, k)
        v_cache.index_copy_(0, slot_mapping, v)

    def forward(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, groups: list[AttentionGroup]) -> torch.Tensor:
        # q: [T, Hq, D] → [T, Hq*D]
        a = self.args
        outs = []
        for g in groups:
            kv_shape = (g.num_rows, g.context_len, a.num_kv_heads, a.head_dim)
            kg = k_cache.index_select(0, g.kv_slots).view(kv_shape).transpose(1, 2)  # [B, Hkv, C, D]
            vg = v_cache.index_select(0, g.kv_slots).view(kv_shape).transpose(1, 2)
            if g.single:
                qg = q[g.start : g.end].view(1, -1, a.num_heads, a.head_dim).transpose(1, 2)  # [1, Hq, Q, D]
                o = F.scaled_dot_product_attention(qg, kg, vg, attn_mask=g.mask, is_causal=g.mask is None, enable_gqa=True)
                outs.append(o.transpose(1, 2).reshape(-1, a.q_size))  # [Q, Hq*D]
                continue
            if g.q_index is None:
                # NOTE: decode: fold each kv head's query group into the query axis, so plain
                # attention does GQA without repeating K/V.
                qg = q[g.start : g.end].reshape(g.num_rows, a.num_kv_heads, -1, a.head_dim)  # [B, Hkv, G, D]
                o = F.scaled_dot_product_attention(qg, kg, vg, attn_mask=g.mask)  # [B, Hkv, G, D]
                outs.append(o.reshape(g.num_rows, a.q_size))
                continue
            qg = q.index_select(0, g.q_index).view(g.num_rows, -1, a.num_heads, a.head_dim)  # [B, Q, Hq, D]
            o = F.scaled_dot_product_attention(qg.transpose(1, 2), kg, vg, attn_mask=g.mask, enable_gqa=True)  # [B, Hq, Q, D]
            o = o.transpose(1, 2).reshape(-1, a.q_size)  # [B*Q, Hq*D]
            outs.append(o.index_select(0, g.out_index))
        return outs[0] if len(outs) == 1 else torch.cat(outs)
