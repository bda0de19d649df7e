"""Triton attention against the gather + SDPA reference on the bench's device: error and time per call.

Used by bench/gpu.py. Both backends get the same step layout (ragged contexts, shuffled block
tables) through their own metadata path, as inside the model.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

BS = 16


def _args(hq: int, hkv: int, d: int) -> SimpleNamespace:
    return SimpleNamespace(num_heads=hq, num_kv_heads=hkv, head_dim=d, q_size=hq * d, kv_size=hkv * d)


def _time(torch, fn, iters: int) -> float:
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters


def run_case(torch, device, name: str, hq: int, hkv: int, d: int, starts: list[int], news: list[int], dtype, iters: int) -> None:
    from kvmesh.engine.attention import BatchLayout, TorchAttention  # noqa: PLC0415
    from kvmesh.engine.attention_triton import TritonAttention  # noqa: PLC0415
    from kvmesh.engine.staging import Staging  # noqa: PLC0415

    gen = torch.Generator().manual_seed(len(starts) + hq)
    lengths = [s + n for s, n in zip(starts, news)]
    blocks = [-(-n // BS) for n in lengths]
    perm = torch.randperm(sum(blocks) + 8, generator=gen).tolist()
    tables, used = [], 0
    for k in blocks:
        tables.append(perm[used : used + k])
        used += k
    k_cache = torch.randn((len(perm) * BS, hkv, d), generator=gen).to(device=device, dtype=dtype)
    v_cache = torch.randn((len(perm) * BS, hkv, d), generator=gen).to(device=device, dtype=dtype)
    q = torch.randn((sum(news), hq, d), generator=gen).to(device=device, dtype=dtype)
    n_dec = sum(1 for n in news if n == 1)
    layout = BatchLayout(starts, news, BatchLayout.pad_tables(tables), n_dec)
    args = _args(hq, hkv, d)
    metas = {}
    for backend in (TorchAttention(args, BS), TritonAttention(args, BS)):
        staging = Staging(device)
        finish = backend.build(layout, staging)
        metas[backend.name] = (backend, finish(staging.upload()))
    ref_backend, ref_meta = metas["torch"]
    tri_backend, tri_meta = metas["triton"]
    ref = ref_backend.forward(q.float(), k_cache.float(), v_cache.float(), ref_meta)
    out = tri_backend.forward(q, k_cache, v_cache, tri_meta)
    err = float((out.float() - ref).norm() / ref.norm())
    t_ref = _time(torch, lambda: ref_backend.forward(q, k_cache, v_cache, ref_meta), iters)
    t_tri = _time(torch, lambda: tri_backend.forward(q, k_cache, v_cache, tri_meta), iters)
    print(f"{name:<44} rel err {err:.1e}   triton {t_tri * 1e6:8.1f} us   reference {t_ref * 1e6:8.1f} us   "
          f"{t_ref / t_tri:5.1f}x", flush=True)


def check_kernels(torch, device, small: bool) -> None:
    """Decode (split-K) and extend (prefix hits, ragged) cases, GQA 1/4/8 (the 8B shape is GQA 4)."""
    dtype = torch.float32 if small else torch.bfloat16
    iters = 1 if small else 20
    print(f"Triton kernels vs gather + SDPA reference ({dtype}, reference in fp32 for the error):")
    if small:
        cases = [
            ("decode gqa8 d64, 2 ragged rows", 8, 1, 64, [5, 70], [1, 1]),
            ("extend gqa8 d128, prefix hit + fresh", 8, 1, 128, [32, 0], [9, 20]),
        ]
    else:
        ragged = [4095, 3000, 2100, 1500, 900, 600, 300, 64] * 4
        cases = [
            ("decode 8B shape (32/8 x128), batch 32 ragged", 32, 8, 128, ragged, [1] * 32),
            ("decode 8B shape, batch 1, 4k context", 32, 8, 128, [4095], [1]),
            ("decode 0.5B shape (14/2 x64), batch 64", 14, 2, 64, ragged * 2, [1] * 64),
            ("decode gqa1 (16/16 x128), batch 8", 16, 16, 128, ragged[:8], [1] * 8),
            ("extend 8B shape, 4096-token prefill", 32, 8, 128, [0], [4096]),
            ("mixed 8B shape: a decode row, prefix hits, chunks", 32, 8, 128, [1000, 2048, 512, 0], [1, 512, 1000, 700]),
        ]
    for name, hq, hkv, d, starts, news in cases:
        run_case(torch, device, name, hq, hkv, d, starts, news, dtype, iters)
