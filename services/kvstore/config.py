"""KV store settings (env prefix KVMESH_KVSTORE_, or the matching --flags)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from kvmesh.runtime.config import MeshSettings

from .blocks import Encoding
from .store import StoreConfig

GiB = 1024**3


class KvStoreSettings(MeshSettings):
    """The KV cache store: a tiered (memory → disk) block store keyed by chained block hash."""

    model_config = SettingsConfigDict(env_prefix="KVMESH_KVSTORE_", populate_by_name=True, extra="ignore")

    host: str = Field("127.0.0.1", description="bind address")
    port: int = Field(50081, description="gRPC port (0 = any free port)")
    advertise_host: str = Field("", description="host others reach the store at (default: host)")
    metrics_port: int = Field(9131, description="Prometheus /metrics port (0 = any free port, -1 = off)")
    store_id: str = Field("", description="publisher id for heartbeats and KV events (default: kvstore-<host>-<pid>)")
    memory_bytes: int = Field(1 * GiB, description="memory tier budget in bytes")
    disk_bytes: int = Field(0, description="disk tier budget in bytes (0 = no disk tier)")
    disk_dir: str = Field(".kvmesh/kvstore", description="directory of the disk tier")
    disk_encoding: str = Field("raw", description="encoding of blocks on disk: raw | int8 | int4")
    idle_cap_s: float = Field(3600.0, description="drop blocks untouched for this long")
    lease_s: float = Field(30.0, description="default lease of blocks found by Lookup")
    max_lease_s: float = Field(600.0, description="longest lease a Lookup may ask for")
    put_timeout_s: float = Field(30.0, description="reclaim a put idle for this long")
    max_blocks_per_put: int = Field(4096, description="most blocks in one Put")
    max_block_bytes: int = Field(64 * 1024 * 1024, description="largest block accepted")
    tick_s: float = Field(1.0, description="period of lease/idle/put expiry sweeps")
    heartbeat_interval_s: float = Field(0.5, description="heartbeat period on NATS")
    nats: bool = Field(True, description="publish heartbeats and KV events on NATS")
    drain_grace_s: float = Field(5.0, description="how long in-flight calls may finish on shutdown")

    def store_config(self) -> StoreConfig:
        try:
            disk_encoding = Encoding[self.disk_encoding.upper()]
        except KeyError:
            raise ValueError(f"disk_encoding {self.disk_encoding!r}: expected raw, int8 or int4") from None
        return StoreConfig(
            memory_bytes=self.memory_bytes,
            disk_bytes=self.disk_bytes,
            disk_encoding=disk_encoding,
            idle_cap_s=self.idle_cap_s,
            lease_s=self.lease_s,
            max_lease_s=self.max_lease_s,
            put_timeout_s=self.put_timeout_s,
            max_blocks_per_put=self.max_blocks_per_put,
            block_size=self.block_size,
            max_block_bytes=self.max_block_bytes,
        )
