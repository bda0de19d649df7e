"""Settings: one pydantic-settings class per service, plus CLI flags generated from its fields.

Mesh-wide settings (`KVMESH_NATS_URL`, `KVMESH_MODEL`, `KVMESH_BLOCK_SIZE`, ...) are shared by
every service; a service's own settings use its prefix (`KVMESH_GATEWAY_PORT`, ...).
"""

from __future__ import annotations

import argparse
import types
import typing
from collections.abc import Sequence
from typing import Any, TypeVar

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from .process import CpuPriority


def mesh_field(default: Any, env: str, description: str) -> Any:
    """A setting read from the mesh-wide variable `KVMESH_<env>` whatever the class's prefix."""
    return Field(default, validation_alias=AliasChoices(f"KVMESH_{env}", env.lower()), description=description)


class MeshSettings(BaseSettings):
    """What every service of one mesh agrees on."""

    model_config = SettingsConfigDict(env_prefix="KVMESH_", populate_by_name=True, extra="ignore")

    nats_url: str = mesh_field("nats://127.0.0.1:4222", "NATS_URL", "NATS server URL(s), comma-separated")
    model: str = mesh_field("tiny", "MODEL", "model directory (HF format) or 'tiny'")
    model_name: str = mesh_field("", "MODEL_NAME", "name served at /v1/models (default: model dir name)")
    block_size: int = mesh_field(16, "BLOCK_SIZE", "KV block size in tokens (mesh-wide)")
    dtype: str = mesh_field("auto", "DTYPE", "model dtype: auto | float32 | bfloat16 | float16")
    otlp_endpoint: str = mesh_field("", "OTLP_ENDPOINT", "OTLP gRPC endpoint for traces; empty = JSONL files")
    trace_dir: str = mesh_field(".kvmesh/traces", "TRACE_DIR", "where JSONL traces go without OTLP")
    tracing: bool = mesh_field(True, "TRACING", "record traces (false = no spans at all)")
    log_level: str = mesh_field("INFO", "LOG_LEVEL", "logging level")
    tls_cert: str = mesh_field("", "TLS_CERT", "PEM certificate for gRPC servers and clients (empty = plaintext)")
    tls_key: str = mesh_field("", "TLS_KEY", "PEM private key for tls_cert")
    tls_ca: str = mesh_field("", "TLS_CA", "PEM CA that signs every peer; servers require client certificates")
    cpu_priority: CpuPriority = mesh_field(
        "normal", "CPU_PRIORITY", "OS CPU priority: normal | low (nice 10) | idle (runs only on otherwise idle CPU)"
    )
    cpus: str = mesh_field(
        "", "CPUS", "CPUs this process runs on, e.g. '0' or '0-3,8' (Linux; empty = any; kvmesh up --pin-engines sets it)"
    )
    heap_trim_s: float = mesh_field(
        5.0, "HEAP_TRIM_S", "workers and the KV store hand freed C heap pages back to the OS this often (0 = never)"
    )
    malloc_mmap_threshold_kib: int = mesh_field(
        4096, "MALLOC_MMAP_THRESHOLD_KIB",
        "workers and the KV store: C allocations of this size or more get their own mapping, returned when freed; "
        "a freed heap top of up to 64 MiB is kept for the next step (glibc; 0 = glibc's dynamic thresholds)",
    )

    def served_model_name(self) -> str:
        if self.model_name:
            return self.model_name
        return "tiny" if self.model == "tiny" else self.model.rstrip("/").split("/")[-1]


S = TypeVar("S", bound=BaseSettings)


def _flag_type(annotation: Any) -> type | None:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        annotation = args[0] if len(args) == 1 else None
    if typing.get_origin(annotation) is typing.Literal and all(isinstance(a, str) for a in typing.get_args(annotation)):
        return str
    return annotation if annotation in (str, int, float, bool) else None


def settings_from_argv(cls: type[S], argv: Sequence[str] | None, prog: str) -> S:
    """Builds `cls` from the environment, overridden by `--flag value` for each simple field."""
    parser = argparse.ArgumentParser(prog=prog, description=cls.__doc__)
    for name, field in cls.model_fields.items():
        kind = _flag_type(field.annotation)
        if kind is None:
            continue
        flag = "--" + name.replace("_", "-")
        if kind is bool:
            parser.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=None, help=field.description)
        else:
            choices = typing.get_args(field.annotation) if typing.get_origin(field.annotation) is typing.Literal else None
            parser.add_argument(flag, dest=name, type=kind, choices=choices, default=None, help=field.description)
    args = parser.parse_args(argv)
    overrides = {k: v for k, v in vars(args).items() if v is not None}
    return cls(**overrides)
