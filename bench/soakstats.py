"""What bench/soak.py samples every interval, and the slopes it prints (no traffic here).

Per process: RSS and open file descriptors (psutil). From /metrics: the scheduler's registry
(`kvmesh_scheduler_assignments`), admission (`kvmesh_scheduler_admitted`, `_queue_depth`), each
decode worker's running requests, the KV store's blocks (`kvmesh_kvstore_blocks`, all tiers), and
the C heap in use of the workers and the store (`kvmesh_process_heap_bytes{state="in_use"}`).
"""

from __future__ import annotations

import re
import time
import urllib.request
from dataclasses import dataclass, field

MIB = 1024 * 1024


def metric(target: str, name: str, **labels: str) -> float:
    """Sum of one metric's samples (those whose labels include `labels`) on a /metrics endpoint
    (NaN when it cannot be read)."""
    try:
        with urllib.request.urlopen(f"http://{target}/metrics", timeout=5) as reply:
            text = reply.read().decode()
    except OSError:
        return float("nan")
    return metric_in(text, name, **labels)


def metric_in(text: str, name: str, **labels: str) -> float:
    """Sum of one metric's samples (those whose labels include `labels`) in /metrics text."""
    total = 0.0
    for line in text.splitlines():
        match = re.match(r"^([a-zA-Z_:][\w:]*)(\{[^}]*\})?\s+(\S+)$", line)
        if match and match.group(1) == name:
            have = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2) or ""))
            if all(have.get(k) == v for k, v in labels.items()):
                total += float(match.group(3))
    return total


@dataclass
class Sampler:
    """Samples `mesh` (a kvmesh.runtime.supervisor.Mesh) into named series of (t_s, value)."""

    mesh: object
    t0: float = field(default_factory=time.monotonic)
    series: dict[str, list[tuple[float, float]]] = field(default_factory=dict)

    def _add(self, name: str, t: float, value: float) -> None:
        self.series.setdefault(name, []).append((t, value))

    def sample(self) -> dict[str, float]:
        import psutil  # noqa: PLC0415

        t = time.monotonic() - self.t0
        now: dict[str, float] = {}
        for run in self.mesh.procs:
            try:
                proc = psutil.Process(run.proc.pid)
                now[f"{run.spec.name}.rss_mib"] = proc.memory_info().rss / MIB
                now[f"{run.spec.name}.fds"] = proc.num_fds()
                for child in proc.children():  # NOTE: a worker's engine process (its own since 2026-12-02)
                    if any("enginehost" in part for part in child.cmdline()):
                        now[f"{run.spec.name}.engine.rss_mib"] = child.memory_info().rss / MIB
                        now[f"{run.spec.name}.engine.fds"] = child.num_fds()
            except psutil.Error:
                continue
        targets = {s.name: s.metrics_target for s in self.mesh.specs if s.metrics_target}
        for name, target in targets.items():
            if name == "scheduler":
                now["scheduler.assignments"] = metric(target, "kvmesh_scheduler_assignments")
                now["scheduler.admitted"] = metric(target, "kvmesh_scheduler_admitted")
                now["scheduler.queue_depth"] = metric(target, "kvmesh_scheduler_queue_depth")
            elif name.startswith("decode"):
                now[f"{name}.running"] = metric(target, "kvmesh_decode_running_requests")
            elif name.startswith("kvstore"):
                now[f"{name}.blocks"] = metric(target, "kvmesh_kvstore_blocks")
            if name.startswith(("prefill", "decode", "kvstore")):  # NOTE: what malloc holds live, beside RSS
                now[f"{name}.heap_in_use_mib"] = metric(target, "kvmesh_process_heap_bytes", state="in_use") / MIB
        for name, value in now.items():
            self._add(name, t, value)
        return now


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope, per minute."""
    pts = [(t, v) for t, v in points if v == v]  # NOTE: drops NaN
    if len(pts) < 2:
        return 0.0
    mt = sum(t for t, _ in pts) / len(pts)
    mv = sum(v for _, v in pts) / len(pts)
    den = sum((t - mt) ** 2 for t, _ in pts)
    return 60.0 * sum((t - mt) * (v - mv) for t, v in pts) / den if den else 0.0


def growth(points: list[tuple[float, float]], window_s: float) -> float:
    """Relative change over the last `window_s`: the rise of the least-squares line through the
    window's samples, over the line's value at the window's start.

    NOTE: a fitted line, not the first and last sample: a worker's RSS moves by ±10% from one
    sample to the next (a long prompt's activations come and go), so two samples measure noise."""
    if not points:
        return 0.0
    end = points[-1][0]
    window = [(t, v) for t, v in points if t >= end - window_s and v == v]
    if len(window) < 2:
        return 0.0
    per_s = slope(window) / 60.0
    mt = sum(t for t, _ in window) / len(window)
    mv = sum(v for _, v in window) / len(window)
    start = mv + per_s * (window[0][0] - mt)
    return per_s * (end - window[0][0]) / start if start else 0.0


def report(series: dict[str, list[tuple[float, float]]], window_s: float) -> list[str]:
    """One line per series: first, last, slope per minute, and growth over the window (RSS)."""
    lines = [f"{'series':34} {'first':>10} {'last':>10} {'slope/min':>10} {'growth':>8}"]
    for name in sorted(series):
        pts = series[name]
        grow = f"{100 * growth(pts, window_s):7.2f}%" if name.endswith("_mib") else ""
        lines.append(f"{name:34} {pts[0][1]:10.1f} {pts[-1][1]:10.1f} {slope(pts):10.3f} {grow:>8}")
    return lines
