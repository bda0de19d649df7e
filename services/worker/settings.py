"""Settings both workers share, and the engine configuration made of them."""

from __future__ import annotations

import os
import socket
from typing import Any

from pydantic import Field

from kvmesh.runtime.blockhash import resolve_dtype
from kvmesh.runtime.config import MeshSettings
from kvmesh.runtime.grpcutil import advertised_endpoint


class WorkerSettings(MeshSettings):
    """Fields both workers share; each worker subclasses it with its own env prefix and ports."""

    host: str = Field("127.0.0.1", description="bind address")
    port: int = Field(0, description="gRPC port (0 = any free port)")
    advertise_host: str = Field("", description="host others reach this worker at (default: host)")
    metrics_port: int = Field(0, description="Prometheus /metrics port (0 = any free port, -1 = off)")
    worker_id: str = Field("", description="worker id (default: <role>-<hostname>-<pid>)")
    pool: str = Field("production", description="worker pool (production | candidate | ...)")
    kvstore: str = Field("", description="KV store endpoint(s) host:port[,...] (shards), 'nats' = shards from their NATS heartbeats, empty = none")
    kvstore_timeout_s: float = Field(0.5, description="deadline for KV store lookups")
    kv_encoding: str = Field("raw", description="KV wire encoding: raw | int8 | int4")
    device: str = Field("auto", description="torch device: auto | cpu | cuda[:n]")
    num_kv_blocks: int = Field(0, description="KV cache blocks (0 = from free GPU memory on CUDA, kv_cache_memory_bytes on CPU)")
    kv_cache_memory_bytes: int = Field(256 * 1024 * 1024, description="KV cache budget in bytes on CPU")
    gpu_memory_utilization: float = Field(0.9, gt=0.0, le=1.0, description="share of GPU memory for weights, activations and the KV cache (CUDA)")
    attention_backend: str = Field("auto", description="attention kernels: auto (triton on CUDA, torch on CPU) | torch | triton")
    enforce_eager: bool = Field(False, description="no CUDA graphs for decode steps")
    max_num_seqs: int = Field(64, description="most sequences in one batch")
    max_num_batched_tokens: int = Field(2048, description="token budget of one engine step")
    max_model_len: int = Field(0, description="context length cap (0 = the model's)")
    heartbeat_interval_s: float = Field(0.5, description="heartbeat period on NATS")
    drain_grace_s: float = Field(10.0, description="how long in-flight requests may finish on shutdown")
    torch_threads: int = Field(0, description="torch intra-op threads (0 = torch's default: one per core)")
    engine_cpus: str = Field(
        "", description="CPUs the engine runs on, e.g. '1' (empty = this worker's): its process's, or with the engine "
        "on a thread (decode engine_process=false) the whole worker's; kvmesh up --pin-engines sets it"
    )
    step_delay_s: float = Field(0.0, description="testing aid: sleep after every engine step (e.g. a deliberately slow canary candidate)")
    engine_call_timeout_s: float = Field(60.0, gt=0.0, description="how long a request waits for the engine (thread or process) to answer a command before UNAVAILABLE")
    engine_stall_s: float = Field(30.0, gt=0.0, description="watchdog: no engine step progress for this long while work is pending = stalled (NOT_SERVING, deregistered)")
    step_slowdown: float = Field(1.0, ge=1.0, description="testing aid: every engine step takes this many times as long (sleeps the difference)")
    cpu_row_buckets: bool = Field(True, description="CPU: a step's rows padded up to a few counts in the packed linears (at most 25% more), so the kernels built per count stay cached")
    cpu_kernel_cache_entries: int = Field(256, ge=1, description="CPU: oneDNN/ideep kernels cached per input shape (each cache; unless LRU_CACHE_CAPACITY / ONEDNN_PRIMITIVE_CACHE_CAPACITY are set)")

    def resolved_worker_id(self, role: str) -> str:
        return self.worker_id or f"{role}-{socket.gethostname()}-{os.getpid()}"

    def endpoint(self, bound_port: int) -> str:
        return advertised_endpoint(self.host, self.advertise_host, bound_port)


def step_pause_s(step_delay_s: float, step_slowdown: float, step_took_s: float) -> float:
    """How long the testing aids `step_delay_s` and `step_slowdown` pause after a step that took
    `step_took_s` (the engine thread and the engine process both sleep this)."""
    return step_delay_s + (step_slowdown - 1.0) * step_took_s


def bound_cpu_kernel_caches(entries: int) -> None:
    """Caps the per-shape kernel caches behind the engine's oneDNN packed linears on CPU; call
    before the engine's first step (an operator's own environment setting wins).

    NOTE (issue 16, the soak): ideep (`LRU_CACHE_CAPACITY`) and oneDNN
    (`ONEDNN_PRIMITIVE_CACHE_CAPACITY`) each keep 1024 kernels by default, one per input shape
    and weight: a prefill worker sees a new token count almost every step, so its live heap grew
    ~1 MiB per new prompt length, 445 → 754 MiB in 25 minutes, and would have kept growing for
    hours. With every prompt the same length, or both caches off, it stays flat.
    """
    for var in ("LRU_CACHE_CAPACITY", "ONEDNN_PRIMITIVE_CACHE_CAPACITY"):
        os.environ.setdefault(var, str(entries))


def engine_config(settings: WorkerSettings) -> Any:
    """EngineConfig from worker settings; the dtype is resolved the mesh-wide way."""
    from kvmesh.engine.config import ModelArgs  # noqa: PLC0415
    from kvmesh.engine.llm import EngineConfig  # noqa: PLC0415
    from kvmesh.engine.tiny import resolve_model  # noqa: PLC0415

    args = ModelArgs.from_dir(resolve_model(settings.model))
    if settings.torch_threads > 0:
        import torch  # noqa: PLC0415

        torch.set_num_threads(settings.torch_threads)
    return EngineConfig(
        model=settings.model,
        model_id=settings.served_model_name(),  # NOTE: the block-hash model id the gateway uses too
        dtype=resolve_dtype(settings.dtype, args.torch_dtype),
        device=settings.device,
        block_size=settings.block_size,
        num_kv_blocks=settings.num_kv_blocks or None,
        kv_cache_memory_bytes=settings.kv_cache_memory_bytes,
        gpu_memory_utilization=settings.gpu_memory_utilization,
        attention_backend=settings.attention_backend,
        enforce_eager=settings.enforce_eager,
        cpu_row_buckets=settings.cpu_row_buckets,
        max_num_seqs=settings.max_num_seqs,
        max_num_batched_tokens=settings.max_num_batched_tokens,
        max_model_len=settings.max_model_len or None,
    )
