"""A bounded soak of a real mesh: does anything only grow? (issue 16)

    nice -n 5 .venv/bin/python bench/soak.py                # 20 minutes, the ~22M model
    nice -n 5 .venv/bin/python bench/soak.py --minutes 3    # a short proof that it works

Starts `kvmesh up --prefill 1 --decode 2` (with the KV store) on a ~22M-param random Llama
(bench/checkpoints.py) and sends mixed traffic from `--concurrency` threads: streaming and not,
client disconnects mid-stream, client-side aborts (a short read timeout), bad requests,
duplicate `X-Request-Id`s, one constant `user`, and long prompts that push KV to the store.
Every `--interval` seconds it samples each process's RSS and open fds, the scheduler's registry
and admission sizes and the store's blocks (bench/soakstats.py), then prints each series' slope.

Goals (exit 1 when one is missed): 0 5xx and 0 transport errors; every request accounted for
(one outcome per request sent, and the gateway counted as many finished requests); RSS of every
process growing under 5% over the last `--window-minutes` (15; 3/4 of the run when shorter);
registry, admission and decode running back to 0 once idle; fds flat (growth under 5% + 8).

The store's memory tier is sized for the soak (`--store-mib`, 128 by default, not the 1 GiB
default): the warm-up fills it within the first minutes and from then on it evicts, so its RSS
can level off inside a 20-minute run instead of filling for the whole of it. Likewise the
scheduler's pre-warm hit counts (`--hot-blocks`, 4,096, not the 65,536 default: ~170 B per
prompt block, bounded, but at the soak's ~2,000 new prompt blocks a minute the default bound is
reached only after half an hour, so the scheduler's RSS would climb for the whole window).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

from checkpoints import SMALL_LLAMA_BYTES, build_llama
from soakstats import Sampler, growth, metric, report

KINDS = {  # kind -> weight
    "stream": 3, "plain": 3, "disconnect": 1, "abort": 1, "bad": 1, "dup_id": 1, "user": 1, "long": 1,
}
BAD_BODIES = [
    b"{not json", b'{"model": "MODEL", "prompt": "x", "max_tokens": -3}',
    b'{"model": "nope", "prompt": "x"}', b'{"model": "MODEL", "prompt": [999999]}',
    b'{"model": "MODEL", "prompt": "x", "temperature": "hot"}',
]


class Traffic:
    """One outcome per request sent, by kind: ok, 4xx, 5xx, disconnected, aborted, error:<type>."""

    def __init__(self, base_url: str, model: str, seed: int) -> None:
        self.base_url, self.model = base_url, model
        self.outcomes: dict[str, Counter] = {k: Counter() for k in KINDS}
        self.sent = 0
        self._lock = threading.Lock()
        rng = random.Random(seed)
        self.prefixes = [[rng.randrange(256) for _ in range(48)] for _ in range(32)]

    def record(self, kind: str, outcome: str) -> None:
        with self._lock:
            self.outcomes[kind][outcome] += 1

    def run(self, deadline: float, seed: int) -> None:
        rng = random.Random(seed)
        kinds, weights = list(KINDS), list(KINDS.values())
        with httpx.Client(base_url=self.base_url, timeout=120) as client:
            while time.monotonic() < deadline:
                kind = rng.choices(kinds, weights)[0]
                with self._lock:
                    self.sent += 1
                try:
                    outcome = getattr(self, f"_{kind}")(client, rng)
                except httpx.TimeoutException:
                    outcome = "error:timeout"
                except httpx.HTTPError as exc:
                    outcome = f"error:{type(exc).__name__}"
                self.record(kind, outcome)

    def _prompt(self, rng: random.Random, extra: int = 16) -> list[int]:
        return rng.choice(self.prefixes) + [rng.randrange(256) for _ in range(extra)]

    def _body(self, rng: random.Random, **fields) -> dict:
        return {"model": self.model, "prompt": self._prompt(rng), "max_tokens": 16, "temperature": 0.7,
                "ignore_eos": True, **fields}

    @staticmethod
    def _status(code: int) -> str:
        return "ok" if code == 200 else "5xx" if code >= 500 else f"{code // 100}xx"

    def _plain(self, client: httpx.Client, rng: random.Random, headers: dict | None = None, **fields) -> str:
        reply = client.post("/v1/completions", json=self._body(rng, **fields), headers=headers or {})
        return self._status(reply.status_code)

    def _stream(self, client: httpx.Client, rng: random.Random) -> str:
        with client.stream("POST", "/v1/completions", json=self._body(rng, stream=True, max_tokens=24)) as reply:
            lines = list(reply.iter_lines())
        if reply.status_code != 200:
            return self._status(reply.status_code)
        return "ok" if "data: [DONE]" in lines else "error:unfinished-stream"

    def _disconnect(self, client: httpx.Client, rng: random.Random) -> str:
        with client.stream("POST", "/v1/completions", json=self._body(rng, stream=True, max_tokens=400)) as reply:
            if reply.status_code != 200:
                return self._status(reply.status_code)
            for _ in zip(range(3), reply.iter_lines()):
                pass
        return "disconnected"

    def _abort(self, client: httpx.Client, rng: random.Random) -> str:
        try:
            reply = client.post("/v1/completions", json=self._body(rng, max_tokens=400), timeout=0.5)
        except httpx.ReadTimeout:
            return "aborted"
        return self._status(reply.status_code)

    def _bad(self, client: httpx.Client, rng: random.Random) -> str:
        body = rng.choice(BAD_BODIES).replace(b"MODEL", self.model.encode())
        reply = client.post("/v1/completions", content=body, headers={"content-type": "application/json"})
        return "4xx" if 400 <= reply.status_code < 500 else self._status(reply.status_code)

    def _dup_id(self, client: httpx.Client, rng: random.Random) -> str:
        return self._plain(client, rng, headers={"X-Request-Id": f"soak-dup-{rng.randrange(2)}"})

    def _user(self, client: httpx.Client, rng: random.Random) -> str:
        return self._plain(client, rng, user="soak-user")

    def _long(self, client: httpx.Client, rng: random.Random) -> str:
        body = self._body(rng, max_tokens=4)
        body["prompt"] = self._prompt(rng, extra=rng.randrange(400, 900))
        reply = client.post("/v1/completions", json=body)
        return self._status(reply.status_code)


def wait_idle(sampler: Sampler, timeout_s: float) -> dict[str, float]:
    """Samples until registry, admission and decode running are all 0 (or the timeout)."""
    deadline = time.monotonic() + timeout_s
    while True:
        now = sampler.sample()
        busy = {k: v for k, v in now.items() if k.endswith((".assignments", ".admitted", ".queue_depth", ".running")) and v}
        if not busy or time.monotonic() > deadline:
            return busy
        time.sleep(2.0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=20.0)
    p.add_argument("--interval", type=float, default=30.0, help="seconds between samples")
    p.add_argument("--window-minutes", type=float, default=15.0, help="RSS growth window (at most 3/4 of the run)")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--model", default="small", help="'small' (the ~22M random Llama), 'tiny', or an HF directory")
    p.add_argument("--series", default="", help="also write every sampled series to this JSON file")
    p.add_argument("--store-mib", type=int, default=128,
                   help="KV store memory tier (MiB): small enough that warm-up fills it and it then evicts")
    p.add_argument("--hot-blocks", type=int, default=4096,
                   help="scheduler pre-warm hit counts kept (prefix blocks): reached during warm-up")
    args = p.parse_args(argv)
    from kvmesh.runtime.launcher import MeshOptions, free_port  # noqa: PLC0415
    from kvmesh.runtime.supervisor import Mesh  # noqa: PLC0415

    with tempfile.TemporaryDirectory() as tmp:
        model = str(build_llama(Path(tmp), **SMALL_LLAMA_BYTES)[1]) if args.model == "small" else args.model
        served = "tiny" if model == "tiny" else Path(model).name
        mesh = Mesh(MeshOptions(model=model, port=free_port(), run_dir=str(Path(tmp) / "run"), prefill=1, decode=2,
                                kvstore=True, settings=[f"kvstore.memory_bytes={args.store_mib * 1024 * 1024}",
                                          f"scheduler.prewarm_max_tracked_blocks={args.hot_blocks}"]))
        mesh.start(timeout_s=300)
        try:
            return soak(mesh, served, args)
        finally:
            mesh.stop()


def soak(mesh, served: str, args: argparse.Namespace) -> int:
    traffic = Traffic(mesh.gateway_url, served, seed=0)
    sampler = Sampler(mesh)
    gateway = next(s.metrics_target for s in mesh.specs if s.name == "gateway")
    finished0 = metric(gateway, "kvmesh_gateway_requests_total", route="/v1/completions")
    deadline = time.monotonic() + 60 * args.minutes
    threads = [threading.Thread(target=traffic.run, args=(deadline, i), daemon=True) for i in range(args.concurrency)]
    for t in threads:
        t.start()
    print(f"soak: {args.minutes:g} min, {args.concurrency} clients, sample every {args.interval:g} s", flush=True)
    while time.monotonic() < deadline:
        now = sampler.sample()
        rss = sum(v for k, v in now.items() if k.endswith("rss_mib"))
        print(f"t={time.monotonic() - sampler.t0:7.0f}s load={os.getloadavg()[0]:.1f} sent={traffic.sent} "
              f"rss_total={rss:.0f}MiB assignments={now.get('scheduler.assignments')} "
              f"admitted={now.get('scheduler.admitted')} store_blocks={now.get('kvstore.blocks')}", flush=True)
        time.sleep(min(args.interval, max(0.0, deadline - time.monotonic())))
    for t in threads:
        t.join(timeout=150)
    busy = wait_idle(sampler, timeout_s=60)
    finished = metric(gateway, "kvmesh_gateway_requests_total", route="/v1/completions") - finished0
    window_s = min(60 * args.window_minutes, 45 * args.minutes)
    print("\n".join(report(sampler.series, window_s)))
    if args.series:
        Path(args.series).write_text(json.dumps(sampler.series))
    outcomes = Counter()
    for kind, counts in traffic.outcomes.items():
        print(f"{kind:10} {dict(counts)}")
        outcomes.update(counts)
    missed = []
    if outcomes["5xx"] or any(k.startswith("error") for k in outcomes):
        missed.append(f"5xx or transport errors: {dict(outcomes)}")
    if sum(outcomes.values()) != traffic.sent or finished != traffic.sent:
        missed.append(f"accounting: sent {traffic.sent}, outcomes {sum(outcomes.values())}, gateway finished {finished:.0f}")
    for name, pts in sampler.series.items():
        if name.endswith("rss_mib") and growth(pts, window_s) >= 0.05:
            missed.append(f"{name} grew {100 * growth(pts, window_s):.1f}% over the last {window_s / 60:g} min")
        if name.endswith(".fds") and pts[-1][1] > 1.05 * pts[len(pts) // 2][1] + 8:
            missed.append(f"{name} went from {pts[len(pts) // 2][1]:.0f} to {pts[-1][1]:.0f}")
    if busy:
        missed.append(f"not idle 60 s after the traffic stopped: {busy}")
    print(f"sent {traffic.sent} requests; gateway finished {finished:.0f}")
    print("GOALS MET" if not missed else "GOALS MISSED:\n  " + "\n  ".join(missed))
    return 0 if not missed else 1


if __name__ == "__main__":
    sys.exit(main())
