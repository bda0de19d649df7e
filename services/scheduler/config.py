"""Scheduler settings (KVMESH_SCHEDULER_*, or --flags of the same names)."""

from __future__ import annotations

from pydantic_settings import SettingsConfigDict

from kvmesh.runtime.config import MeshSettings

from .admission import AdmissionConfig, Order
from .pd import PdConfig
from .policy import POLICY_NAMES, CostModel, PolicyConfig
from .router import RouterConfig

_COST = CostModel()


class SchedulerSettings(MeshSettings):
    """kvmesh scheduler: worker registry, global KV block index, routing policy, admission queue."""

    model_config = SettingsConfigDict(env_prefix="KVMESH_SCHEDULER_", populate_by_name=True, extra="ignore")

    host: str = "127.0.0.1"
    port: int = 50051
    metrics_port: int = 9101
    policy: str = "round_robin"
    heartbeat_timeout_s: float = 3.0
    # P/D
    local_prefill_max_tokens: int = 64
    prefill_queue_max_s: float = 2.0
    store_fetch_factor: float = 0.2
    # admission
    admission_capacity_factor: float = 1.0
    admission_queue_factor: float = 1.0
    queue_order: str = "fcfs"
    aging_quota: int = 8
    # sticky sessions (0 = off)
    sticky_ttl_s: float = 300.0
    # kv_aware
    kv_prefill_weight: float = 1.0
    kv_decode_weight: float = 2.0
    kv_temperature: float = 0.0
    kv_overlap_decay: float = 0.5
    kv_queue_weight: float = 0.5
    prediction_ttl_s: float = 2.0
    # dualmap
    ttft_slo_s: float = 1.0
    dualmap_prefix_blocks: int = 4
    dualmap_hot_factor: float = 2.0
    # cost model (bench/sim_calibration.md)
    prefill_s_per_token: float = _COST.prefill_s_per_token
    decode_s_per_step: float = _COST.decode_s_per_step
    decode_s_per_seq: float = _COST.decode_s_per_seq
    # KV event repair
    replay_timeout_s: float = 2.0

    def check(self) -> None:
        if self.policy not in POLICY_NAMES:
            raise ValueError(f"unknown policy {self.policy!r}: expected one of {', '.join(POLICY_NAMES)}")
        if self.queue_order not in tuple(Order):
            raise ValueError(f"unknown queue_order {self.queue_order!r}: expected fcfs or short_first")

    def policy_config(self) -> PolicyConfig:
        return PolicyConfig(
            kv_prefill_weight=self.kv_prefill_weight,
            kv_decode_weight=self.kv_decode_weight,
            kv_temperature=self.kv_temperature,
            kv_overlap_decay=self.kv_overlap_decay,
            kv_queue_weight=self.kv_queue_weight,
            dualmap_ttft_slo_s=self.ttft_slo_s,
            dualmap_prefix_blocks=self.dualmap_prefix_blocks,
            dualmap_hot_factor=self.dualmap_hot_factor,
        )

    def router_config(self) -> RouterConfig:
        cost = CostModel(self.prefill_s_per_token, self.decode_s_per_step, self.decode_s_per_seq, self.block_size)
        pd = PdConfig(self.local_prefill_max_tokens, self.prefill_queue_max_s, self.store_fetch_factor)
        return RouterConfig(cost, pd, self.prediction_ttl_s)

    def admission_config(self) -> AdmissionConfig:
        return AdmissionConfig(
            capacity_factor=self.admission_capacity_factor,
            queue_factor=self.admission_queue_factor,
            order=Order(self.queue_order),
            aging_quota=self.aging_quota,
        )
