"""A real Prometheus (Debian's `prometheus` package) scraping given targets, for query checks."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from kvmesh.runtime.launcher import free_port

# Label values for a synthetic exporter; anything unnamed gets "x".
SAMPLE_LABELS = {"status": "200", "route": "/v1/chat/completions", "policy": "kv_aware", "prefill": "remote",
                 "role": "decode", "pool": "production", "encoding": "raw", "source": "store", "tier": "memory",
                 "reason": "lru", "quantile": "0.5", "kind": "decode"}


def prometheus_binary() -> str | None:
    return shutil.which("prometheus")


@dataclass
class Prometheus:
    """A started Prometheus; `query(expr)` is an instant query's result vector."""

    url: str
    proc: subprocess.Popen
    log: Path

    def api(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=10) as reply:
            body = json.loads(reply.read())
        if body.get("status") != "success":
            raise AssertionError(f"{path} {params}: {body}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.api("query", query=expr)
        assert data["resultType"] in ("vector", "scalar"), data
        return data["result"] if data["resultType"] == "vector" else [{"value": data["result"]}]

    def wait_for_samples(self, targets: int, samples: int = 3, timeout_s: float = 60.0) -> None:
        """Until every target was scraped up `samples` times within the last minute."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited: {self.log.read_text()[-2000:]}")
            try:
                counts = [float(r["value"][1]) for r in self.query("count_over_time(up[1m])")]
            except OSError:
                counts = []
            if len(counts) >= targets and all(c >= samples for c in counts):
                return
            time.sleep(0.5)
        down = self.query("up == 0") if self.proc.poll() is None else []
        raise TimeoutError(f"prometheus did not scrape {targets} targets {samples} times; down: {down}")

    def wait_for_scrapes_after(self, since: float, scrapes: int = 3, timeout_s: float = 30.0) -> None:
        """Until every target was scraped `scrapes` times after wall-clock time `since`, so series
        born before `since` have the two samples rate() needs."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            oldest = self.query("min(timestamp(up))")
            if oldest and float(oldest[0]["value"][1]) >= since + scrapes - 0.5:
                return
            time.sleep(0.5)
        raise TimeoutError(f"prometheus did not scrape every target {scrapes} times after {since}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_prometheus(binary: str, targets: list[str], work_dir: Path, timeout_s: float = 30.0) -> Prometheus:
    """Prometheus on a free loopback port scraping `targets` ("host:port", path /metrics) every second."""
    work_dir.mkdir(parents=True, exist_ok=True)
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "900ms"},
        "scrape_configs": [{"job_name": "kvmesh", "static_configs": [{"targets": list(targets)}]}],
    }
    (work_dir / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = work_dir / "prometheus.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [binary, f"--config.file={work_dir / 'prometheus.yml'}", f"--storage.tsdb.path={work_dir / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdout=out, stderr=subprocess.STDOUT,
        )
    prom = Prometheus(f"http://127.0.0.1:{port}", proc, log)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"prometheus exited with {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{prom.url}/-/ready", timeout=1) as reply:
                if reply.status == 200:
                    return prom
        except OSError:
            pass
        time.sleep(0.2)
    prom.stop()
    raise TimeoutError(f"prometheus not ready after {timeout_s}s: {log.read_text()[-2000:]}")


@dataclass
class SyntheticExporter:
    """Serves every METRICS.md metric with moving values, as a stand-in for a whole mesh."""

    metrics: dict[str, dict[str, Any]]
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    port: int = 0

    def __post_init__(self) -> None:
        self._series: list[tuple[str, Any]] = []
        for name, info in self.metrics.items():
            labels = info["labels"]
            if info["type"] == "counter":
                metric = Counter(name.removesuffix("_total"), name, labels, registry=self.registry)
            elif info["type"] == "histogram":
                metric = Histogram(name, name, labels, registry=self.registry)
            else:
                metric = Gauge(name, name, labels, registry=self.registry)
            child = metric.labels(*[SAMPLE_LABELS.get(label, "x") for label in labels]) if labels else metric
            self._series.append((info["type"], child))
        self._stop = threading.Event()

    def tick(self) -> None:
        for kind, child in self._series:
            if kind == "counter":
                child.inc(3)
            elif kind == "histogram":
                child.observe(0.02)
            else:
                child.set(2)

    def start(self) -> str:
        self.tick()
        self._server, _thread = start_http_server(0, addr="127.0.0.1", registry=self.registry)
        self.port = self._server.server_port
        threading.Thread(target=self._run, daemon=True).start()
        return f"127.0.0.1:{self.port}"

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self.tick()

    def stop(self) -> None:
        self._stop.set()
        self._server.shutdown()
