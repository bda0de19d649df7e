"""Linear layers: plain `F.linear`, or oneDNN with pre-packed weights on CPU.

NOTE: on CPU, `F.linear` goes to the BLAS library, which is far from peak on some CPUs
(MKL on AMD) and re-lays out the weight on every call. oneDNN with a weight packed once at
load time is 2-4x faster for decode-sized batches. Numerics match fp32 GEMM to rounding.
With several threads only large weights are packed: oneDNN splits every GEMM across all OpenMP
threads, and for small GEMMs on a busy machine the wait for a descheduled thread costs far more
than the GEMM itself (BLAS keeps small GEMMs on one thread).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class Linear:
    """`y = x @ weight.T + bias` for x [N, in]; weight [out, in]."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.weight = weight
        self.bias = bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class PackedLinear(Linear):
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__(torch.ops.mkldnn._reorder_linear_weight(weight, 16), bias)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")


def packed_linear_works(dtype: torch.dtype) -> bool:
    """Whether oneDNN packed linear is available here and agrees with F.linear."""
    if dtype not in (torch.float32, torch.bfloat16) or not torch.backends.mkldnn.is_available():
        return False
    try:
        g = torch.Generator().manual_seed(0)
        w = torch.randn(48, 32, generator=g).to(dtype)
        b = torch.randn(48, generator=g).to(dtype)
        x = torch.randn(5, 32, generator=g).to(dtype)
        tol = 1e-4 if dtype == torch.float32 else 5e-2
        return torch.allclose(PackedLinear(w, b)(x).float(), F.linear(x, w, b).float(), atol=tol, rtol=tol)
    except (RuntimeError, AttributeError):
        return False


PACK_MIN_ELEMENTS = 1 << 21


def make_linear(weight: torch.Tensor, bias: torch.Tensor | None, packed: bool) -> Linear:
    """A packed oneDNN linear when `packed` and the weight is large enough to gain from it."""
    if packed and (weight.numel() >= PACK_MIN_ELEMENTS or torch.get_num_threads() == 1):
        return PackedLinear(weight, bias)
    return Linear(weight, bias)
