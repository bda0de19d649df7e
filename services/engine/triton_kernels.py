"""Triton kernels over the paged KV cache: fused K/V write, split-K decode attention, extend attention.

Cache layout (one layer): `k_cache`, `v_cache` [slots, Hkv, D] with slot = block * block_size + offset;
a row's block table maps its token position p to block `block_table[p // block_size]`.

- `write_kv`: one launch writes the new tokens' K and V into their slots; slot -1 is skipped
  (padding rows of a captured CUDA graph).
- `decode_attention`: one query token per row. Grid (rows, kv heads, splits): each program takes
  all query heads of one kv head (GQA: K/V are read once per group) over one slice of the context,
  and writes a partial output with its log-sum-exp; a second kernel merges the splits. The number
  of splits depends on the batch size only, so a captured graph stays valid for any context.
- `extend_attention`: ragged new-token chunks (prefill, chunked prefill, prefix hits) attending
  causally over their whole context in the cache (their own K/V written there first).

All kernels run under `TRITON_INTERPRET=1` on CPU tensors, which is how tests check them.
`UPCAST` computes the dot products in fp32: the interpreter multiplies bf16/fp16 operands as raw
bits, so under it half-precision inputs are upcast after loading (on a GPU they stay as they are).
"""

from __future__ import annotations

import triton
import triton.language as tl

LOG2E = 1.4426950408889634


@triton.jit
def _write_kv_kernel(
    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh, stride_cs, stride_ch,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0)
    h = tl.program_id(1)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot >= 0:
        d = tl.arange(0, BLOCK_D)
        dm = d < HEAD_DIM
        dst = slot * stride_cs + h * stride_ch + d
        k = tl.load(k_ptr + t * stride_kt + h * stride_kh + d, mask=dm)
        tl.store(k_cache_ptr + dst, k, mask=dm)
        v = tl.load(v_ptr + t * stride_vt + h * stride_vh + d, mask=dm)
        tl.store(v_cache_ptr + dst, v, mask=dm)


@triton.jit
def _decode_split_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_table_ptr, seq_lens_ptr, o_part_ptr, lse_part_ptr,
    stride_qb, stride_qh, stride_cs, stride_ch, stride_bt, num_splits, qk_scale_log2,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, UPCAST: tl.constexpr,
):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + b)
    split_len = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
    start = split * split_len
    end = tl.minimum(start + split_len, seq_len)

    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    gm = g < GROUP
    dm = d < HEAD_DIM
    heads = kvh * GROUP + g  # [BG] query heads of this kv head
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :], mask=gm[:, None] & dm[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)

    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)  # [BN]
        pm = pos < end
        page = tl.load(block_table_ptr + b * stride_bt + pos // BLOCK_SIZE, mask=pm, other=0).to(tl.int64)
        slot = page * BLOCK_SIZE + pos % BLOCK_SIZE
        kv_off = slot[:, None] * stride_cs + kvh * stride_ch + d[None, :]  # [BN, BD]
        kv_mask = pm[:, None] & dm[None, :]
        k = tl.load(k_cache_ptr + kv_off, mask=kv_mask, other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
        s = tl.dot(q, tl.trans(k)) * qk_scale_log2  # [BG, BN], log2 units
        s = tl.where(pm[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_cache_ptr + kv_off, mask=kv_mask, other=0.0)
        if UPCAST:
            v = v.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new

    has = l_i > 0
    out = acc / tl.where(has, l_i, 1.0)[:, None]
    lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))  # log2 units
    part = (b * GROUP * tl.num_programs(1) + heads) * num_splits + split  # [BG] index into [B, Hq, S]
    tl.store(o_part_ptr + part[:, None] * HEAD_DIM + d[None, :], out, mask=gm[:, None] & dm[None, :])
    tl.store(lse_part_ptr + part, lse, mask=gm)


@triton.jit
def _decode_merge_kernel(
    o_part_ptr, lse_part_ptr, out_ptr, stride_ob, num_splits,
    HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    sm = s < num_splits
    dm = d < HEAD_DIM
    base = (b * tl.num_programs(1) + h) * num_splits
    lse = tl.load(lse_part_ptr + base + s, mask=sm, other=float("-inf"))  # [BS]
    m = tl.max(lse, 0)
    m = tl.where(m == float("-inf"), 0.0, m)  # an empty row (seq_len 0, graph padding) gives zeros
    w = tl.exp2(lse - m)
    o = tl.load(o_part_ptr + (base + s)[:, None] * HEAD_DIM + d[None, :], mask=sm[:, None] & dm[None, :], other=0.0)
    total = tl.sum(w, 0)
    out = tl.sum(w[:, None] * o, 0) / tl.where(total > 0, total, 1.0)  # [BD]
    tl.store(out_ptr + b * stride_ob + h * HEAD_DIM + d, out.to(out_ptr.dtype.element_ty), mask=dm)


@triton.jit
def _extend_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, block_table_ptr,
    prog_seq_ptr, prog_m_ptr, q_starts_ptr, q_lens_ptr, ctx_lens_ptr,
    stride_qt, stride_qh, stride_ot, stride_cs, stride_ch, stride_bt, qk_scale_log2,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, UPCAST: tl.constexpr,
):
    pid = tl.program_id(0)
    h = tl.program_id(1)
    seq = tl.load(prog_seq_ptr + pid)
    m0 = tl.load(prog_m_ptr + pid)
    q_len = tl.load(q_lens_ptr + seq)
    ctx = tl.load(ctx_lens_ptr + seq)
    q_start = tl.load(q_starts_ptr + seq)
    prefix = ctx - q_len
    kvh = h // GROUP

    offs_m = m0 + tl.arange(0, BLOCK_M)  # [BM] query index within the row's new tokens
    d = tl.arange(0, BLOCK_D)
    mm = offs_m < q_len
    dm = d < HEAD_DIM
    rows = (q_start + offs_m).to(tl.int64)
    q = tl.load(q_ptr + rows[:, None] * stride_qt + h * stride_qh + d[None, :], mask=mm[:, None] & dm[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    q_pos = prefix + offs_m  # [BM] absolute positions

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    end = tl.minimum(ctx, prefix + m0 + BLOCK_M)  # causal: no key after the block's last query
    for n0 in range(0, end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)  # [BN]
        pm = pos < end
        page = tl.load(block_table_ptr + seq * stride_bt + pos // BLOCK_SIZE, mask=pm, other=0).to(tl.int64)
        slot = page * BLOCK_SIZE + pos % BLOCK_SIZE
        kv_off = slot[:, None] * stride_cs + kvh * stride_ch + d[None, :]
        kv_mask = pm[:, None] & dm[None, :]
        k = tl.load(k_cache_ptr + kv_off, mask=kv_mask, other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
        s = tl.dot(q, tl.trans(k)) * qk_scale_log2  # [BM, BN]
        s = tl.where(pm[None, :] & (pos[None, :] <= q_pos[:, None]), s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_cache_ptr + kv_off, mask=kv_mask, other=0.0)
        if UPCAST:
            v = v.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new

    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    dst = out_ptr + rows[:, None] * stride_ot + h * HEAD_DIM + d[None, :]
    tl.store(dst, out.to(out_ptr.dtype.element_ty), mask=mm[:, None] & dm[None, :])
