"""Triton kernels against the SDPA reference on fresh random inputs (TRITON_INTERPRET=1 on CPU).

Outputs are poisoned with NaN first, so an element a kernel fails to write fails the test. Each
case prints ‖out − ref‖/‖ref‖ (run with -s to see it).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")
from kvmesh.engine.attention_triton import (  # noqa: E402
    decode_attention, extend_attention, num_splits_for, stage_extend, write_kv,
)
from kvmesh.engine.staging import Staging  # noqa: E402

BS = 16
CPU = torch.device("cpu")
SHAPES = [(4, 4, 64), (8, 2, 128), (8, 1, 64)]  # (Hq, Hkv, D): GQA ratios 1, 4, 8; head_dim 64 and 128
IDS = ["gqa1-d64", "gqa4-d128", "gqa8-d64"]


def make_cache(num_blocks: int, hkv: int, d: int, gen: torch.Generator, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (num_blocks * BS, hkv, d)
    return torch.randn(shape, generator=gen).to(dtype), torch.randn(shape, generator=gen).to(dtype)


def shuffled_tables(lengths: list[int], num_blocks: int, gen: torch.Generator) -> list[list[int]]:
    """Disjoint, shuffled, non-contiguous block tables covering each row's length."""
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    tables, used = [], 0
    for n in lengths:
        k = -(-n // BS)
        tables.append(perm[used : used + k])
        used += k
    return tables


def gather(cache: torch.Tensor, table: list[int], n: int) -> torch.Tensor:
    pos = torch.arange(n)
    slots = torch.tensor(table)[pos // BS] * BS + pos % BS
    return cache[slots]  # [n, Hkv, D]


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix: int) -> torch.Tensor:
    """SDPA in fp64: q [n, Hq, D] at positions prefix.. attends causally to k, v [prefix+n, Hkv, D]."""
    n, ctx = q.shape[0], k.shape[0]
    mask = torch.arange(ctx)[None, :] <= (prefix + torch.arange(n))[:, None]  # [n, ctx]
    o = F.scaled_dot_product_attention(
        q.double().transpose(0, 1), k.double().transpose(0, 1), v.double().transpose(0, 1), attn_mask=mask, enable_gqa=True
    )  # [Hq, n, D]
    return o.transpose(0, 1).reshape(n, -1)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref).norm() / ref.norm())


def padded(tables: list[list[int]]) -> torch.Tensor:
    w = max(len(t) for t in tables)
    return torch.tensor([t + [0] * (w - len(t)) for t in tables])


@pytest.mark.parametrize("hq,hkv,d", SHAPES, ids=IDS)
@pytest.mark.parametrize("splits", [1, 4])
def test_decode_matches_reference(hq: int, hkv: int, d: int, splits: int) -> None:
    gen = torch.Generator().manual_seed(hq * 100 + d + splits)
    lengths = [1, 37, 150, 16]  # ragged; 16 ends exactly on a block boundary
    k_cache, v_cache = make_cache(24, hkv, d, gen, torch.float32)
    tables = shuffled_tables(lengths, 24, gen)
    q = torch.randn(len(lengths), hq, d, generator=gen)
    out = torch.full((len(lengths), hq * d), float("nan"))
    decode_attention(q, k_cache, v_cache, padded(tables), torch.tensor(lengths), out, splits, BS, block_n=32)
    for i, n in enumerate(lengths):
        ref = reference(q[i : i + 1], gather(k_cache, tables[i], n), gather(v_cache, tables[i], n), n - 1)
        err = rel_err(out[i : i + 1], ref)
        print(f"decode {hq}/{hkv} d{d} splits {splits} len {n}: rel err {err:.2e}")
        assert err < 1e-5


def test_decode_empty_row_gives_zeros() -> None:
    """A padded row of a captured graph (seq_len 0) writes zeros, not NaN."""
    gen = torch.Generator().manual_seed(7)
    k_cache, v_cache = make_cache(4, 2, 64, gen, torch.float32)
    out = torch.full((2, 8 * 64), float("nan"))
    q = torch.randn(2, 8, 64, generator=gen)
    decode_attention(q, k_cache, v_cache, torch.tensor([[0, 1], [0, 0]]), torch.tensor([20, 0]), out, 4, BS)
    assert torch.equal(out[1], torch.zeros(8 * 64))
    assert not out[0].isnan().any()


def run_extend(q: torch.Tensor, k_cache, v_cache, tables, starts: list[int], news: list[int], block_m: int) -> torch.Tensor:
    staging = Staging(CPU)
    q_starts = [sum(news[:i]) for i in range(len(news))]
    finish = stage_extend(staging, padded(tables), q_starts, news, [s + n for s, n in zip(starts, news)], block_m)
    out = torch.full((q.shape[0], q.shape[1] * q.shape[2]), float("nan"), dtype=q.dtype)
    extend_attention(q, k_cache, v_cache, finish(staging.upload()), out, BS, block_n=16)
    return out


@pytest.mark.parametrize("hq,hkv,d", SHAPES, ids=IDS)
def test_extend_matches_reference_with_prefix_hits(hq: int, hkv: int, d: int) -> None:
    gen = torch.Generator().manual_seed(hq * 10 + d)
    starts = [0, 32, 5, 48]  # row 1 and 3: prefix hits (cached blocks); row 2: a chunked prefill's second chunk
    news = [21, 17, 1, 40]
    lengths = [s + n for s, n in zip(starts, news)]
    k_cache, v_cache = make_cache(24, hkv, d, gen, torch.float32)
    tables = shuffled_tables(lengths, 24, gen)
    q = torch.randn(sum(news), hq, d, generator=gen)
    out = run_extend(q, k_cache, v_cache, tables, starts, news, block_m=16)
    first = 0
    for i, (s, n) in enumerate(zip(starts, news)):
        ctx = s + n
        ref = reference(q[first : first + n], gather(k_cache, tables[i], ctx), gather(v_cache, tables[i], ctx), s)
        err = rel_err(out[first : first + n], ref)
        print(f"extend {hq}/{hkv} d{d} prefix {s} new {n}: rel err {err:.2e}")
        assert err < 1e-5
        first += n


def test_extend_bf16_within_bf16_tolerance() -> None:
    gen = torch.Generator().manual_seed(3)
    starts, news = [16, 0], [9, 30]
    k_cache, v_cache = make_cache(8, 2, 64, gen, torch.bfloat16)
    tables = shuffled_tables([s + n for s, n in zip(starts, news)], 8, gen)
    q = torch.randn(sum(news), 8, 64, generator=gen).to(torch.bfloat16)
    out = run_extend(q, k_cache, v_cache, tables, starts, news, block_m=16)
    ref = torch.cat([
        reference(q[:9], gather(k_cache, tables[0], 25), gather(v_cache, tables[0], 25), 16),
        reference(q[9:], gather(k_cache, tables[1], 30), gather(v_cache, tables[1], 30), 0),
    ])
    err = rel_err(out, ref)
    print(f"extend bf16: rel err {err:.2e}")
    assert err < 2e-2


def test_write_kv_fills_exactly_the_given_slots() -> None:
    gen = torch.Generator().manual_seed(5)
    k_cache = torch.full((64, 2, 64), float("nan"))
    v_cache = torch.full((64, 2, 64), float("nan"))
    qkv = torch.randn(5, 8 + 2 + 2, 64, generator=gen)  # [T, Hq+2Hkv, D]; k and v are strided views
    k, v = qkv[:, 8:10], qkv[:, 10:]
    slots = torch.tensor([3, 40, -1, 17, 63])  # -1: a padding row, skipped
    write_kv(k, v, k_cache, v_cache, slots)
    written = slots[slots >= 0]
    assert torch.equal(k_cache[written], k[slots >= 0]) and torch.equal(v_cache[written], v[slots >= 0])
    untouched = torch.ones(64, dtype=torch.bool)
    untouched[written] = False
    assert k_cache[untouched].isnan().all() and v_cache[untouched].isnan().all()


def test_num_splits_depends_on_batch_only_and_is_bounded() -> None:
    assert num_splits_for(1, 8) == 16
    assert num_splits_for(32, 8) == 2
    assert num_splits_for(64, 8) == 1
    assert all(1 <= num_splits_for(b, h) <= 16 for b in (1, 3, 64, 512) for h in (1, 8))
