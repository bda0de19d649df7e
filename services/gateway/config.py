"""Gateway settings (`KVMESH_GATEWAY_*`, API keys from the mesh-wide `KVMESH_API_KEYS`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from kvmesh.runtime.config import MeshSettings, mesh_field


class GatewaySettings(MeshSettings):
    """kvmesh gateway: OpenAI-compatible HTTP API in front of the scheduler and decode workers."""

    model_config = SettingsConfigDict(env_prefix="KVMESH_GATEWAY_", populate_by_name=True, extra="ignore")

    host: str = Field("127.0.0.1", description="HTTP bind address")
    port: int = Field(8000, description="HTTP port (0 = pick a free port)")
    scheduler: str = Field(
        "127.0.0.1:50051", description="scheduler gRPC endpoint(s) host:port, comma-separated: replicas, tried in turn on failure"
    )
    pool: str = Field("", description="worker pool to route to (empty = the production pool)")
    request_timeout_s: float = Field(600.0, description="deadline of one whole request (Generate stream)")
    route_timeout_s: float = Field(30.0, description="deadline of one route (a Scheduler.Route call or a route on the Routes stream), admission wait included")
    route_stream: bool = Field(
        True, description="Route and Complete on one long-lived Scheduler.Routes stream per scheduler replica "
        "(off: one unary call each, as for a replica that answers the stream UNIMPLEMENTED)"
    )
    default_max_tokens: int = Field(256, description="max_tokens when the request names none (capped by the context)")
    max_model_len: int = Field(0, description="context length cap in tokens (0 = the model's max_position_embeddings); lowered to what the workers report")
    context_refresh_s: float = Field(2.0, gt=0.0, description="how often the workers' reported max_model_len is read from the scheduler")
    max_body_bytes: int = Field(4 * 1024 * 1024, description="largest accepted request body")
    max_stop_sequences: int = Field(4, description="most stop sequences per request")
    max_stop_length: int = Field(256, description="longest stop sequence in characters")
    max_concurrent_streams_per_key: int = Field(0, description="in-flight generations per API key (0 = unlimited)")
    session_from_user: bool = Field(
        False, description="use the OpenAI `user` field as the sticky session id when no X-Session-Id is sent"
    )
    max_migrations: int = Field(2, description="re-routes of a request whose decode worker failed mid-stream")
    mirror_sample: float = Field(0.0, description="fraction of requests mirrored to the canary (0 = off)")
    mirror_buffer: int = Field(1024, description="mirror records buffered before drops")
    admin_key: str = Field("", description="bearer key for /admin routes (e.g. PUT /admin/mirror); empty = no admin routes")
    tool_call_parser: Literal["auto", "hermes", "llama3_json"] = Field(
        "auto", description="tool-call format of the model's output: hermes (Qwen2/2.5), llama3_json (Llama 3.1+), auto (from the chat template)"
    )
    shutdown_grace_s: float = Field(10.0, description="how long in-flight requests may finish on SIGTERM")
    api_keys: str = mesh_field("", "API_KEYS", "comma-separated API keys; empty = no auth")

    def api_key_set(self) -> frozenset[str]:
        return frozenset(k.strip() for k in self.api_keys.split(",") if k.strip())
