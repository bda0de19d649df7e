"""Prefill worker settings (`KVMESH_PREFILL_*`, or `--flag` on the command line)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from kvmesh.worker.settings import WorkerSettings


class PrefillSettings(WorkerSettings):
    """kvmesh prefill worker: computes prompt KV and pushes it to the requesting decode worker."""

    model_config = SettingsConfigDict(env_prefix="KVMESH_PREFILL_", populate_by_name=True, extra="ignore")

    port: int = Field(50061, description="gRPC port (0 = any free port)")
    metrics_port: int = Field(9111, description="Prometheus /metrics port (0 = any free port, -1 = off)")
    push_timeout_s: float = Field(30.0, description="deadline for one PushKv stream to a decode worker")
    kvstore_replicas: int = Field(1, ge=1, description="sharded KV store: copies of a hot block (on the next shards in rendezvous order)")
    kvstore_hot_hits: int = Field(4, ge=1, description="sharded KV store: reads of a block (by this worker) that make it hot")
