"""The Triton attention backend: launch wrappers for `triton_kernels` and the step metadata they read."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton

from kvmesh.engine import triton_kernels as K
from kvmesh.engine.attention import BatchLayout
from kvmesh.engine.config import ModelArgs
from kvmesh.engine.staging import Staging

MAX_SPLITS = 16
TARGET_PROGRAMS = 512  # about 4 waves on a 132-SM H200
# NOTE: read when this module is imported, like Triton itself reads it (see triton_kernels).
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def num_splits_for(batch: int, num_kv_heads: int) -> int:
    """Split-K factor for decode: enough programs to fill the GPU, from the batch size alone
    (so a CUDA graph captured for a batch bucket stays valid for any context length)."""
    return max(1, min(MAX_SPLITS, -(-TARGET_PROGRAMS // (batch * num_kv_heads))))


@dataclass(slots=True)
class ExtendMeta:
    """Prefill/extend rows: new tokens of row i are flat tokens q_starts[i] ... q_starts[i]+q_lens[i]-1."""

    block_tables: torch.Tensor  # [Bp, W]
    q_starts: torch.Tensor  # [Bp]
    q_lens: torch.Tensor  # [Bp]
    ctx_lens: torch.Tensor  # [Bp] cached + new tokens
    prog_seq: torch.Tensor  # [P] row of each program
    prog_m: torch.Tensor  # [P] first query (within the row) of each program
    block_m: int


@dataclass(slots=True)
class TritonMeta:
    num_decode: int
    decode_tables: torch.Tensor | None  # [Bd, W]
    seq_lens: torch.Tensor | None  # [Bd] context length including the new token
    num_splits: int
    extend: ExtendMeta | None


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """k, v [T, Hkv, D] (any row/head strides, unit last stride) into caches [slots, Hkv, D]; slot -1 skips."""
    t, h, d = k.shape
    if t == 0:
        return
    K._write_kv_kernel[(t, h)](
        k, v, k_cache, v_cache, slot_mapping, k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), HEAD_DIM=d, BLOCK_D=triton.next_power_of_2(d),
    )


def decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor,
    out: torch.Tensor, num_splits: int, block_size: int, block_n: int = 32,
) -> None:
    """q [B, Hq, D] → out [B, Hq*D]; row b attends to its first seq_lens[b] cached tokens."""
    b, hq, d = q.shape
    hkv = k_cache.shape[1]
    group = hq // hkv
    o_part = torch.empty((b, hq, num_splits, d), dtype=torch.float32, device=q.device)
    lse_part = torch.empty((b, hq, num_splits), dtype=torch.float32, device=q.device)
    block_d = triton.next_power_of_2(d)
    K._decode_split_kernel[(b, hkv, num_splits)](
        q, k_cache, v_cache, block_tables, seq_lens, o_part, lse_part,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), block_tables.stride(0), num_splits,
        K.LOG2E / math.sqrt(d),
        GROUP=group, HEAD_DIM=d, BLOCK_SIZE=block_size, BLOCK_G=max(16, triton.next_power_of_2(group)),
        BLOCK_N=block_n, BLOCK_D=block_d, UPCAST=INTERPRETED and q.dtype != torch.float32,
    )
    K._decode_merge_kernel[(b, hq)](
        o_part, lse_part, out, out.stride(0), num_splits,
        HEAD_DIM=d, BLOCK_S=triton.next_power_of_2(num_splits), BLOCK_D=block_d,
    )


def extend_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: ExtendMeta, out: torch.Tensor,
    block_size: int, block_n: int = 64,
) -> None:
    """Causal attention of ragged new-token chunks over their whole cached context; q [T, Hq, D] → out [T, Hq*D]."""
    _, hq, d = q.shape
    hkv = k_cache.shape[1]
    K._extend_kernel[(meta.prog_seq.shape[0], hq)](
        q, k_cache, v_cache, out, meta.block_tables, meta.prog_seq, meta.prog_m, meta.q_starts, meta.q_lens, meta.ctx_lens,
        q.stride(0), q.stride(1), out.stride(0), k_cache.stride(0), k_cache.stride(1), meta.block_tables.stride(0),
        K.LOG2E / math.sqrt(d),
        GROUP=hq // hkv, HEAD_DIM=d, BLOCK_SIZE=block_size, BLOCK_M=meta.block_m, BLOCK_N=block_n,
        BLOCK_D=triton.next_power_of_2(d), UPCAST=INTERPRETED and q.dtype != torch.float32,
    )


def stage_extend(
    staging: Staging, tables: torch.Tensor, q_starts: list[int], q_lens: list[int], ctx_lens: list[int], block_m: int,
) -> Callable[[dict[str, torch.Tensor]], ExtendMeta]:
    """Add extend metadata (block tables [Bp, W]) to `staging`; returns its builder from the upload."""
    prog_seq, prog_m = [], []
    for i, n in enumerate(q_lens):
        for m0 in range(0, n, block_m):
            prog_seq.append(i)
            prog_m.append(m0)
    for name, values in (("x_tables", tables), ("x_q_starts", q_starts), ("x_q_lens", q_lens), ("x_ctx_lens", ctx_lens),
                         ("x_prog_seq", prog_seq), ("x_prog_m", prog_m)):
        staging.add(name, values)

    def finish(up: dict[str, torch.Tensor]) -> ExtendMeta:
        return ExtendMeta(
            up["x_tables"], up["x_q_starts"], up["x_q_lens"], up["x_ctx_lens"],
            up["x_prog_seq"], up["x_prog_m"], block_m,
        )

    return finish


class TritonAttention:
    """CUDA backend: fused K/V write, split-K paged decode, paged causal extend (see triton_kernels)."""

    name = "triton"

    def __init__(self, args: ModelArgs, block_size: int, block_m: int = 64) -> None:
        self.args = args
        self.block_size = block_size
        self.block_m = block_m

    def build(self, layout: BatchLayout, staging: Staging) -> Callable[[dict[str, torch.Tensor]], TritonMeta]:
        n_dec, w = layout.num_decode, layout.block_tables.shape[1]
        tables = layout.block_tables
        if n_dec:
            staging.add("d_tables", tables[:n_dec])
            staging.add("d_seq_lens", [s + 1 for s in layout.starts[:n_dec]])
        extend = None
        if n_dec < len(layout.starts):
            q_lens = layout.num_new[n_dec:]
            q_starts = [n_dec + sum(q_lens[:i]) for i in range(len(q_lens))]
            ctx = [s + n for s, n in zip(layout.starts[n_dec:], q_lens)]
            extend = stage_extend(staging, tables[n_dec:], q_starts, q_lens, ctx, self.block_m)
        splits = num_splits_for(max(n_dec, 1), self.args.num_kv_heads)

        def finish(up: dict[str, torch.Tensor]) -> TritonMeta:
            return TritonMeta(n_dec, up.get("d_tables"), up.get("d_seq_lens"), splits, extend(up) if extend else None)

        return finish

    def write_kv(self, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        write_kv(k, v, k_cache, v_cache, slot_mapping)

    def forward(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: TritonMeta) -> torch.Tensor:
        # q: [T, Hq, D] → [T, Hq*D]
        out = torch.empty((q.shape[0], self.args.q_size), dtype=q.dtype, device=q.device)
        n = meta.num_decode
        if n:
            decode_attention(q[:n], k_cache, v_cache, meta.decode_tables, meta.seq_lens, out[:n], meta.num_splits, self.block_size)
        if meta.extend is not None:
            extend_attention(q, k_cache, v_cache, meta.extend, out, self.block_size)
        return out
