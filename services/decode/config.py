"""Decode worker settings (`KVMESH_DECODE_*`, or `--flag` on the command line)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from kvmesh.worker.settings import WorkerSettings


class DecodeSettings(WorkerSettings):
    """kvmesh decode worker: continuous-batching generation over KV pushed by prefill workers."""

    model_config = SettingsConfigDict(env_prefix="KVMESH_DECODE_", populate_by_name=True, extra="ignore")

    port: int = Field(50071, description="gRPC port (0 = any free port)")
    metrics_port: int = Field(9121, description="Prometheus /metrics port (0 = any free port, -1 = off)")
    prefill_timeout_s: float = Field(30.0, description="deadline for a remote Prefill call (then prefill locally)")
    handback_queue: int = Field(
        64, ge=0, description="finished turns waiting to be handed to the KV store (more are dropped; a queued turn is its "
        "token ids only; 0 = hand nothing back)"
    )
    handback_window_s: float = Field(
        0.05, ge=0.0, description="a hand-back Put waits for more finished turns to share it until none has ended for this "
        "long (0 = none)"
    )
    handback_max_window_s: float = Field(
        0.25, ge=0.0, description="... but no longer than this after its first turn ended"
    )
    handback_batch_turns: int = Field(
        32, ge=1, description="... and goes at once when this many finished turns wait for it"
    )
    kvstore_put_timeout_s: float = Field(10.0, description="deadline for one KvStore.Put")
    engine_process: bool = Field(
        True, description="run the engine in a child process, at most one message per step, as vLLM V1 runs its EngineCore "
        "(false = on a thread of this one, which shares the GIL with gRPC and asyncio: under a trace's arrivals its "
        "decode steps ran 1.5-2x their cost alone, the process's 0.94-1.15x; docs/engine-process.md)"
    )
    stream_interval: int = Field(
        8, ge=1, description="token stream under load: the engine lets its requests' tokens go every this many steps, "
        "all on the same step, or sooner (stream_interval_ms) (a request's first token and its end at once; 1 = every "
        "token at once, always): docs/token-stream.md"
    )
    stream_interval_ms: float = Field(
        20.0, ge=0, description="... and no token under load waits longer than this (then every held token goes on the "
        "step that finds it waited as long; 0 = steps only): on slow steps (a large model's) the chunks keep coming "
        "every ~20 ms"
    )
    stream_interval_from: int = Field(
        16, ge=1, description="stream_interval holds tokens only while at least this many requests are in the engine; "
        "below it every token goes out at once (low-load latency as with 1)"
    )
