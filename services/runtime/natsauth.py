"""NATS users and per-service subject permissions for a mesh that `kvmesh up` starts.

Each service connects as its own user and may publish/subscribe only the subjects its role
needs, so a compromised or buggy service cannot impersonate another (e.g. the gateway cannot
publish worker heartbeats). Pure: returns the nats-server config text and the URLs.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

from .bus import HEARTBEAT_REQUEST_SUBJECT

INBOX = "_INBOX.>"
HEARTBEAT_REQUEST = HEARTBEAT_REQUEST_SUBJECT

# publish / subscribe allow-lists per service; "allow_responses" lets a service answer requests.
PERMISSIONS: dict[str, dict[str, list[str] | bool]] = {
    "gateway": {"publish": ["kvmesh.mirror.requests"], "subscribe": [INBOX]},
    "scheduler": {"publish": ["kvmesh.kv.replay.>", "kvmesh.kv.prewarm.>", "kvmesh.schedulers.>", HEARTBEAT_REQUEST],
                  "subscribe": ["kvmesh.workers.>", "kvmesh.kv.events.>", "kvmesh.schedulers.>", INBOX],
                  "allow_responses": True},  # answers a starting peer's kvmesh.schedulers.sync
    "prefill": {"publish": ["kvmesh.workers.prefill.>", "kvmesh.kv.events.>"],
                "subscribe": ["kvmesh.kv.replay.>", "kvmesh.workers.kvstore.>", HEARTBEAT_REQUEST], "allow_responses": True},
    "decode": {"publish": ["kvmesh.workers.decode.>", "kvmesh.kv.events.>"],
               "subscribe": ["kvmesh.kv.replay.>", "kvmesh.kv.prewarm.>", "kvmesh.workers.kvstore.>", HEARTBEAT_REQUEST],
               "allow_responses": True},
    "kvstore": {"publish": ["kvmesh.workers.kvstore.>", "kvmesh.kv.events.>"],
                "subscribe": ["kvmesh.kv.replay.>", "kvmesh.workers.kvstore.>", HEARTBEAT_REQUEST], "allow_responses": True},
    "canary": {"publish": [], "subscribe": ["kvmesh.mirror.requests", INBOX]},
}


@dataclass(frozen=True, slots=True)
class NatsAuth:
    passwords: dict[str, str]

    @classmethod
    def generate(cls) -> NatsAuth:
        return cls({service: secrets.token_urlsafe(18) for service in PERMISSIONS})

    def url(self, service: str, host: str, ports: int | Sequence[int]) -> str:
        """The service's URL for each NATS node, comma-separated (every client gets all nodes)."""
        ports = [ports] if isinstance(ports, int) else list(ports)
        return ",".join(f"nats://{service}:{self.passwords[service]}@{host}:{port}" for port in ports)

    def server_config(self, host: str, port: int, cluster_port: int = 0, peers: Sequence[int] = (), name: str = "") -> str:
        """One node's config; with `cluster_port`, it listens for routes there and routes to the
        `peers`' cluster ports (a full mesh on `host`)."""
        users = []
        for service, perms in PERMISSIONS.items():
            permissions: dict[str, object] = {
                "publish": {"allow": perms["publish"] or ["_kvmesh.nothing"]},
                "subscribe": {"allow": perms["subscribe"]},
            }
            if perms.get("allow_responses"):
                permissions["allow_responses"] = True
            users.append({"user": service, "password": self.passwords[service], "permissions": permissions})
        # NOTE: nats-server's config format accepts JSON syntax.
        config: dict[str, object] = {"listen": f"{host}:{port}", "authorization": {"users": users}}
        if cluster_port:
            config["server_name"] = name or f"nats-{port}"
            config["cluster"] = {"name": "kvmesh", "listen": f"{host}:{cluster_port}",
                                 "routes": [f"nats-route://{host}:{p}" for p in peers if p != cluster_port]}
        return json.dumps(config, indent=2)
