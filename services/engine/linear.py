"""Linear layers: plain `F.linear`, or oneDNN with pre-packed weights on CPU.

NOTE: on CPU, `F.linear` goes to the BLAS library, which is far from peak on some CPUs
(MKL on AMD) and re-lays out the weight on every call. oneDNN with a weight packed once at
load time is 2-4x faster for decode-sized batches. Numerics match fp32 GEMM to rounding.
With several threads only large weights are packed: oneDNN splits every GEMM across all OpenMP
threads, and for small GEMMs on a busy machine the wait for a descheduled thread costs far more
than the GEMM itself (BLAS keeps small GEMMs on one thread).

NOTE: oneDNN builds (JIT) and caches a kernel per input shape and weight: a step of a token count
the engine has not run lately costs ~0.7 ms per distinct weight shape to build (2.5-3 ms a step on
`tiny`, where the cached GEMMs take 0.3-0.5), and each kernel holds ~0.5 MiB. Prompts of every
length make nearly every prefill step a new count, so a packed linear runs its rows padded up to
a bucket (`bucket_rows`): the counts a worker meets stay few enough to stay cached (about 45 up to
2,112 rows, four weight shapes each, under the 256 entries services/worker/settings.py caps each
cache at), for at most 25% more rows of GEMM.
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


ROWS_EXACT = 16  # up to this many rows (decode batches) a packed linear runs the exact count


def bucket_rows(n: int) -> int:
    """The row count a packed linear runs `n` rows at: `n` up to ROWS_EXACT, then `n` rounded up to a
    quarter of the power of two below it (four counts per doubling; at most 25% more rows)."""
    if n <= ROWS_EXACT:
        return n
    step = 1 << (n.bit_length() - 3)
    return -(-n // step) * step


class PackedLinear(Linear):
    """`bucketed`: rows padded up to `bucket_rows` (see the module NOTE); the output is the same."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, bucketed: bool = True) -> None:
        super().__init__(torch.ops.mkldnn._reorder_linear_weight(weight, 16), bias)
        self.bucketed = bucketed

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        m = bucket_rows(n) if self.bucketed else n
        if m != n:
            x = F.pad(x, (0, 0, 0, m - n))  # [m, in], zero rows after the n real ones
        y = torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        return y[:n] if m != n else y


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


def make_linear(weight: torch.Tensor, bias: torch.Tensor | None, packed: bool, bucketed: bool = True) -> Linear:
    """A packed oneDNN linear when `packed` and the weight is large enough to gain from it
    (`bucketed`: its rows padded to `bucket_rows`)."""
    if packed and (weight.numel() >= PACK_MIN_ELEMENTS or torch.get_num_threads() == 1):
        return PackedLinear(weight, bias, bucketed)
    return Linear(weight, bias)
