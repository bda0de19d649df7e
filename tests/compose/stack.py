"""A compose project run through the compose CLI (`docker compose` or `docker-compose` 1.29), and
what the tests read back: published ports, container health and events, Prometheus queries.
Talks to the mesh only through ports published on 127.0.0.1."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
FILES = ("compose.yaml", "compose.test.yaml")
# Every port compose.yaml publishes: empty = a free host port (read back with `port`).
PUBLISHED = ("NATS", "NATS1", "NATS2", "KVSTORE", "CANARY", "GATEWAY", "OTLP", "TEMPO", "PROMETHEUS", "GRAFANA")


def compose_tool() -> list[str]:
    """`docker compose` (v2) when the plugin answers, else `docker-compose` (1.29)."""
    v2 = subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=30)
    return ["docker", "compose"] if v2.returncode == 0 else ["docker-compose"]


def eventually(predicate: Callable[[], Any], timeout_s: float, every_s: float = 1.0) -> Any:
    """`predicate()`'s first truthy value, polled every `every_s`; None after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value or None
        time.sleep(every_s)


class Stack:
    """compose.yaml + compose.test.yaml as project `project`, on images built beforehand."""

    def __init__(self, project: str) -> None:
        self.project = project
        self.tool = compose_tool()
        self.env = {"KVMESH_PUBLISH_HOST": "127.0.0.1", **{f"KVMESH_PUBLISH_{p}_PORT": "" for p in PUBLISHED}}

    def compose(self, *args: str, timeout_s: float = 300, check: bool = True) -> str:
        argv = [*self.tool, "-p", self.project, *(a for f in FILES for a in ("-f", str(ROOT / f))), *args]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT,
                              env={**os.environ, **self.env})
        if check and done.returncode != 0:
            raise RuntimeError(f"{shlex.join(argv)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
        return done.stdout

    def docker(self, *args: str, timeout_s: float = 60) -> str:
        done = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout_s)
        if done.returncode != 0:
            raise RuntimeError(f"docker {shlex.join(args)} exited {done.returncode}: {done.stderr}")
        return done.stdout

    # -- what runs ---------------------------------------------------------------------------
    def containers(self, service: str | None = None, all_: bool = False) -> list[str]:
        """Ids of the project's containers (of one service), running unless `all_`."""
        filters = ["--filter", f"label=com.docker.compose.project={self.project}"]
        if service:
            filters += ["--filter", f"label=com.docker.compose.service={service}"]
        return self.docker("ps", "-q", *(["-a"] if all_ else []), *filters).split()

    def inspect(self, container: str) -> dict[str, Any]:
        return json.loads(self.docker("inspect", container))[0]

    def health(self, service: str) -> list[str]:
        """Each running container's health status (`starting`, `healthy`, `unhealthy`)."""
        return [self.inspect(c)["State"].get("Health", {}).get("Status", "none") for c in self.containers(service)]

    def address(self, container: str) -> str:
        [network] = self.inspect(container)["NetworkSettings"]["Networks"].values()
        return network["IPAddress"]

    def port(self, service: str, port: int) -> int:
        """The 127.0.0.1 host port `service`'s container `port` is published on."""
        host, _, published = self.compose("port", service, str(port)).strip().rpartition(":")
        assert host == "127.0.0.1", f"{service}:{port} is published on {host}, not 127.0.0.1"
        return int(published)

    def watch_events(self, *kinds: str) -> list[dict[str, Any]]:
        """Collects the project's container events of `kinds` (e.g. start, health_status) from now
        on into the returned list, until `close()`. (Live: the engine keeps only its last 256
        events, and health checks' execs fill that in seconds.)"""
        args = ["docker", "events", "--format", "{{json .}}", "--filter", "type=container",
                "--filter", f"label=com.docker.compose.project={self.project}", *(f"--filter=event={k}" for k in kinds)]
        self._watcher = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
        seen: list[dict[str, Any]] = []

        def read() -> None:
            for line in self._watcher.stdout:
                seen.append(json.loads(line))

        threading.Thread(target=read, daemon=True).start()
        return seen

    def close(self) -> None:
        if getattr(self, "_watcher", None) is not None:
            self._watcher.terminate()
            self._watcher.wait(timeout=10)

    def leftovers(self) -> dict[str, list[str]]:
        """Containers, networks and volumes still labelled with this project."""
        label = f"label=com.docker.compose.project={self.project}"
        return {
            "containers": self.docker("ps", "-aq", "--filter", label).split(),
            "networks": self.docker("network", "ls", "-q", "--filter", label).split(),
            "volumes": self.docker("volume", "ls", "-q", "--filter", label).split(),
        }

    # -- Prometheus ----------------------------------------------------------------------------
    def promql(self, query: str) -> list[dict[str, Any]]:
        """An instant query's result vector from the published Prometheus."""
        url = f"http://127.0.0.1:{self.port('prometheus', 9090)}/api/v1/query?" + urllib.parse.urlencode({"query": query})
        with urllib.request.urlopen(url, timeout=10) as reply:
            body = json.load(reply)
        assert body["status"] == "success", body
        return body["data"]["result"]

    def scraped_since(self, job: str, since: float, targets: int, timeout_s: float = 30) -> bool:
        """Waits until Prometheus has scraped all `targets` of `job` after time `since` (so that
        a query then sees every replica's counters as of `since` or later)."""
        def fresh() -> bool:
            stamps = self.promql(f'timestamp(up{{job="{job}"}})')
            return len(stamps) == targets and all(float(r["value"][1]) > since for r in stamps)
        return bool(eventually(fresh, timeout_s, every_s=0.5))
