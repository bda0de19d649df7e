"""Canary settings (env prefix KVMESH_CANARY_, or the matching --flags)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from kvmesh.runtime.config import MeshSettings

from .verdict import Thresholds


class CanarySettings(MeshSettings):
    """kvmesh canary: replays mirrored traffic on a candidate pool, compares, promotes or rolls back."""

    model_config = SettingsConfigDict(env_prefix="KVMESH_CANARY_", populate_by_name=True, extra="ignore")

    host: str = Field("127.0.0.1", description="address of the gRPC and REST servers")
    port: int = Field(50091, description="gRPC port (0 = any free port)")
    http_port: int = Field(8091, description="REST port: /report /promote /rollback /metrics /health (0 = any)")
    scheduler: str = Field("127.0.0.1:50051", description="scheduler host:port")
    production_pool: str = Field("production", description="pool serving production traffic")
    candidate_pool: str = Field("candidate", description="pool under test")
    buffer_bytes: int = Field(16 * 1024 * 1024, ge=1, description="memory budget of the mirror buffer")
    buffer_max_records: int = Field(256, ge=1, description="most records waiting for replay")
    dedup_window: int = Field(4096, description="recent request ids / prompt keys remembered for dedup")
    noise_sample: float = Field(0.1, ge=0.0, le=1.0, description="fraction of records also replayed on production (noise floor)")
    max_concurrency: int = Field(2, ge=1, description="replays in flight at once")
    warmup_replays: int = Field(2, ge=0, description="first candidate replays (after start or a promote/rollback) that only warm it up: not compared")
    replay_timeout_s: float = Field(60.0, gt=0, description="deadline of one replay")
    latency_window: int = Field(10_000, description="latency samples kept per side for quantiles")
    min_samples: int = Field(20, description="compared requests before a verdict")
    max_agreement_drop: float = Field(0.02, description="allowed token agreement below the noise floor")
    max_error_rate_increase: float = Field(0.01, description="allowed candidate minus production error rate")
    max_ttft_p99_regression: float = Field(1.5, description="allowed candidate/production TTFT p99 ratio")
    max_tpot_p99_regression: float = Field(1.5, description="allowed candidate/production TPOT p99 ratio")
    latency_slack_s: float = Field(0.005, description="absolute latency slack added to the p99 limits")
    admin_key: str = Field("", description="bearer key that POST /promote and /rollback require (empty = none: keep the REST port private)")
    grace_s: float = Field(5.0, description="shutdown grace period for replays in flight")
    state_file: str = Field(".kvmesh/canary-rollout.json", description="where the automatic rollout is kept across restarts (empty = nowhere)")
    rollout_on_restart: Literal["resume", "rollback"] = Field("resume", description="a rollout running when the canary restarted: resume its step (window starts over) or roll back")
    rollout_tick_s: float = Field(0.5, gt=0, description="how often the rollout judges its current step")
    candidate_cpu_priority: Literal["normal", "low", "idle"] = Field("normal", description="CPU priority the candidate workers run at (kvmesh up passes its own); below normal their latency is not comparable and does not fail a rollout step unless the rollout asks (judge_latency)")

    def thresholds(self) -> Thresholds:
        return Thresholds(
            min_samples=self.min_samples,
            max_agreement_drop=self.max_agreement_drop,
            max_error_rate_increase=self.max_error_rate_increase,
            max_ttft_p99_regression=self.max_ttft_p99_regression,
            max_tpot_p99_regression=self.max_tpot_p99_regression,
            latency_slack_s=self.latency_slack_s,
        )
