"""Scheduler settings (KVMESH_SCHEDULER_*, or --flags of the same names)."""

from __future__ import annotations

import os
from collections.abc import Mapping

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from kvmesh.runtime.config import MeshSettings

from .admission import AdmissionConfig, Order
from .pd import PdConfig
from .policy import POLICY_NAMES, CostModel, PolicyConfig
from .prewarm import PrewarmConfig
from .router import RouterConfig

_COST = CostModel()
REMOVED_DECAY = "KVMESH_SCHEDULER_KV_OVERLAP_DECAY"  # utilization units; now kv_overlap_decay_requests


class SchedulerSettings(MeshSettings):
    """kvmesh scheduler: worker registry, global KV block index, routing policy, admission queue."""

    model_config = SettingsConfigDict(env_prefix="KVMESH_SCHEDULER_", populate_by_name=True, extra="ignore")

    host: str = Field("127.0.0.1", description="gRPC bind address")
    port: int = Field(50051, description="gRPC port (0 = any free port)")
    metrics_port: int = Field(9101, description="Prometheus /metrics port")
    policy: str = Field("kv_aware", description="routing policy: round_robin, least_loaded, prefix_affinity, kv_aware, dualmap")
    heartbeat_timeout_s: float = Field(3.0, description="a worker silent this long is dropped (with its index entries); the registry is swept every sixth of it, at most every 0.5 s")
    reconcile_grace_s: float = Field(
        5.0, description="a routed request its decode worker's heartbeat still does not list after this is reclaimed (lost Complete)"
    )
    engine_stall_s: float = Field(
        10.0, gt=0.0, description="a worker with work whose heartbeat engine_progress has not moved for this long gets no new requests"
    )
    # P/D
    local_prefill_max_tokens: int = Field(64, description="uncached prompt tokens up to which the decode worker prefills itself")
    prefill_queue_max_s: float = Field(2.0, description="prefill workers queued longer than this → prefill locally on the decode worker")
    store_fetch_factor: float = Field(0.2, description="cost of fetching a block from the KV store, as a fraction of recomputing it")
    # admission
    admission_capacity_factor: float = Field(1.0, description="running requests admitted = this x sum of decode workers' max_num_seqs")
    admission_queue_factor: float = Field(1.0, description="requests that may wait for admission = this x capacity; beyond → 429")
    queue_order: str = Field("fcfs", description="admission queue order: fcfs or short_first (with quota-based aging)")
    aging_quota: int = Field(8, description="short_first: a waiting request is passed over at most this many times")
    # sticky sessions (0 = off)
    sticky_ttl_s: float = Field(300.0, description="session stickiness idle TTL in seconds (0 = off)")
    sticky_overload_factor: float = Field(
        2.0, description="a session's sticky worker yields when full or at this many times its fair share of load (0 = only when full)"
    )
    # kv_aware
    kv_prefill_weight: float = Field(1.0, description="kv_aware: weight of blocks still to prefill")
    kv_decode_weight: float = Field(2.0, description="kv_aware: weight of the worker's decode load")
    kv_temperature: float = Field(0.0, description="kv_aware: softmax temperature over -cost (0 = pick the cheapest)")
    kv_overlap_decay_requests: float = Field(
        6.0, description="kv_aware: overlap credit decays as exp(-requests above the worker's fair share of load / this) (0 = no decay)"
    )
    kv_queue_weight: float = Field(0.5, description="kv_aware: weight of prefill work already queued on the worker")
    prediction_ttl_s: float = Field(2.0, description="blocks predicted at routing time count as cached for this long")
    # dualmap
    ttft_slo_s: float = Field(1.0, description="dualmap: switch to load balancing when predicted TTFT exceeds this")
    dualmap_prefix_blocks: int = Field(4, description="dualmap: leading blocks hashed to pick the two candidates")
    dualmap_hot_factor: float = Field(2.0, description="dualmap: a worker this many times above mean load is a hot spot")
    # cost model (bench/sim_calibration.md)
    prefill_s_per_token: float = Field(_COST.prefill_s_per_token, description="cost model: prefill seconds per uncached token (bench/sim_calibration.md)")
    decode_s_per_step: float = Field(_COST.decode_s_per_step, description="cost model: seconds per decode step, fixed part")
    decode_s_per_seq: float = Field(_COST.decode_s_per_seq, description="cost model: seconds per decode step per running sequence")
    # replicas (docs/replicas.md)
    replica_id: str = Field("", description="this replica's id among active-active scheduler replicas (empty = host-pid)")
    replica_heartbeat_s: float = Field(0.5, description="interval of this replica's heartbeat to its peers")
    replica_timeout_s: float = Field(2.0, description="a peer replica silent this long is gone (its admission share returns)")
    sync_timeout_s: float = Field(3.0, ge=0, description="start-up sync: NOT_SERVING until every worker a peer hears is known and its KV events repaired, or this long")
    sync_alone_s: float = Field(0.2, ge=0, description="start-up sync with no peer replica: wait this long for the heartbeats asked for")
    # KV event repair
    replay_timeout_s: float = Field(2.0, description="deadline of a KV event replay request after a sequence gap")
    # KV pre-warming of decode workers that join (docs/prewarm.md)
    prewarm: bool = Field(True, description="pre-warm a decode worker that registers with the mesh's hottest prefixes from the KV store")
    prewarm_budget_blocks: int = Field(256, ge=0, description="most KV blocks one joining worker is asked to fetch")
    prewarm_half_life_s: float = Field(300.0, gt=0, description="prefix hit counts halve this often (what 'recent' means)")
    prewarm_timeout_s: float = Field(30.0, gt=0, description="a worker still warming after this counts as warm (and the warm-up as timed out)")
    prewarm_max_tracked_blocks: int = Field(65536, ge=1, description="most prefix blocks whose hit counts are kept (beyond it the coldest are forgotten, down to half; ~170 B each)")

    def check(self, environ: Mapping[str, str] = os.environ) -> None:
        if REMOVED_DECAY in environ:
            raise ValueError(
                f"{REMOVED_DECAY} was replaced by KVMESH_SCHEDULER_KV_OVERLAP_DECAY_REQUESTS, counted in requests "
                "above the worker's fair share, not in utilization (default 6); unset the old variable"
            )
        if self.policy not in POLICY_NAMES:
            raise ValueError(f"unknown policy {self.policy!r}: expected one of {', '.join(POLICY_NAMES)}")
        if self.queue_order not in tuple(Order):
            raise ValueError(f"unknown queue_order {self.queue_order!r}: expected fcfs or short_first")

    def policy_config(self) -> PolicyConfig:
        return PolicyConfig(
            kv_prefill_weight=self.kv_prefill_weight,
            kv_decode_weight=self.kv_decode_weight,
            kv_temperature=self.kv_temperature,
            kv_overlap_decay_requests=self.kv_overlap_decay_requests,
            kv_queue_weight=self.kv_queue_weight,
            dualmap_ttft_slo_s=self.ttft_slo_s,
            dualmap_prefix_blocks=self.dualmap_prefix_blocks,
            dualmap_hot_factor=self.dualmap_hot_factor,
        )

    def router_config(self) -> RouterConfig:
        cost = CostModel(self.prefill_s_per_token, self.decode_s_per_step, self.decode_s_per_seq, self.block_size)
        pd = PdConfig(self.local_prefill_max_tokens, self.prefill_queue_max_s, self.store_fetch_factor)
        return RouterConfig(cost, pd, self.prediction_ttl_s, self.sticky_overload_factor)

    def prewarm_config(self) -> PrewarmConfig:
        return PrewarmConfig(self.prewarm and self.prewarm_budget_blocks > 0, self.prewarm_budget_blocks,
                             self.prewarm_half_life_s, self.prewarm_max_tracked_blocks)

    def admission_config(self) -> AdmissionConfig:
        return AdmissionConfig(
            capacity_factor=self.admission_capacity_factor,
            queue_factor=self.admission_queue_factor,
            order=Order(self.queue_order),
            aging_quota=self.aging_quota,
        )
