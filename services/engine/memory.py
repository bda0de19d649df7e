"""KV cache sizing: how many blocks fit, and the max_model_len that follows (torch-free core).

On CUDA, like vLLM: after the weights are loaded, one profiling forward pass at the step's full
token budget measures the activation peak; the cache then gets

    total × gpu_memory_utilization − (memory in use now) − (activation peak above what is held now)

where "in use now" (weights, CUDA context, other processes) comes from the driver's free-memory
figure. On CPU a byte budget is given instead. `max_model_len` is the checkpoint's
`max_position_embeddings` (or a smaller configured cap), lowered only when one sequence's KV
cannot fit the whole cache, which is logged.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol

log = logging.getLogger(__name__)


class DeviceMemory(Protocol):
    """What sizing reads from the device (tests pass a fake with set figures)."""

    def mem_get_info(self) -> tuple[int, int]:
        """(free, total) bytes on the device, as the driver reports them."""

    def reset_peak(self) -> None: ...

    def peak_allocated(self) -> int:
        """Most bytes this process's tensors held since `reset_peak`."""

    def allocated(self) -> int:
        """Bytes this process's tensors hold now."""


@dataclass(frozen=True, slots=True)
class MemoryProfile:
    total: int
    free: int  # after the profiling pass, with cached blocks released
    activation_peak: int  # peak during the profiling pass above what is still held after it


@dataclass(frozen=True, slots=True)
class KvCachePlan:
    num_blocks: int
    max_model_len: int
    lowered_from: int | None  # the length asked for, when one sequence could not fit it


def kv_bytes_from_profile(profile: MemoryProfile, gpu_memory_utilization: float) -> int:
    """Bytes left for the KV cache after weights, activations and everything else on the device."""
    if not 0.0 < gpu_memory_utilization <= 1.0:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    in_use = profile.total - profile.free
    return int(profile.total * gpu_memory_utilization) - in_use - profile.activation_peak


def plan_kv_cache(kv_bytes: int, bytes_per_block: int, block_size: int, model_max_len: int, requested_max_len: int | None) -> KvCachePlan:
    """Blocks that fit `kv_bytes` and the resulting max_model_len; raises when not one block fits."""
    num_blocks = kv_bytes // bytes_per_block
    if num_blocks < 1:
        raise MemoryError(
            f"no room for the KV cache: {kv_bytes / 2**20:.0f} MiB left, one block needs {bytes_per_block / 2**20:.2f} MiB "
            "(raise gpu_memory_utilization or kv_cache_memory_bytes, or use a smaller model)"
        )
    want = min(requested_max_len or model_max_len, model_max_len)
    fits = num_blocks * block_size
    if want <= fits:
        return KvCachePlan(num_blocks, want, None)
    log.warning(
        "max_model_len lowered from %d to %d: the KV cache holds %d blocks of %d tokens, not enough for one "
        "sequence of %d tokens", want, fits, num_blocks, block_size, want,
    )
    return KvCachePlan(num_blocks, fits, want)


class CudaMemory:
    """`DeviceMemory` of one CUDA device."""

    def __init__(self, device: object) -> None:
        import torch  # noqa: PLC0415 - the core above stays torch-free

        self._cuda = torch.cuda
        self.device = device

    def mem_get_info(self) -> tuple[int, int]:
        self._cuda.empty_cache()
        return self._cuda.mem_get_info(self.device)

    def reset_peak(self) -> None:
        self._cuda.synchronize(self.device)
        self._cuda.reset_peak_memory_stats(self.device)

    def peak_allocated(self) -> int:
        self._cuda.synchronize(self.device)
        return self._cuda.max_memory_allocated(self.device)

    def allocated(self) -> int:
        return self._cuda.memory_allocated(self.device)
