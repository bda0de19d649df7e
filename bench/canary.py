"""Does mirroring to a slow candidate slow production down? One command, one run:

    .venv/bin/python bench/canary.py [--window-s 15] [--rounds 2] [--concurrency 4] [--candidate-priority idle]

One mesh (tiny model): a production pool, a candidate pool whose decode steps are `--slowdown`
times slower (the `decode.step_slowdown` test setting), and the canary. Closed-loop production
traffic runs in windows; the gateway's mirror sample is switched between 0 and 1 through its
`PUT /admin/mirror` route, in the order off, on, on, off (repeated `--rounds` times) so a drift in
the machine's load hits both alike. Each window starts from an idle mesh, and an "off" window
starts only once the canary has nothing buffered or replaying.

Prints production TTFT p50/p99 with mirroring off and with 100% mirroring, the p99 ratio
(goal: at most 5% slower), the same ratio between the two halves of the "off" windows (what this
machine's noise alone does to the p99), and what the canary did. Ratios, not absolute numbers,
are the result: the machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

ADMIN_KEY = "bench-admin"


@dataclass
class Samples:
    ttfts: list[float] = field(default_factory=list)
    tpots: list[float] = field(default_factory=list)

    def add(self, other: Samples) -> None:
        self.ttfts += other.ttfts
        self.tpots += other.tpots

    def pct(self, q: float, which: str = "ttfts") -> float:
        xs = sorted(getattr(self, which))
        return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


class Load:
    """`concurrency` threads sending distinct streaming completions until `run_window` ends."""

    def __init__(self, base_url: str, concurrency: int, prompt_tokens: int, max_tokens: int) -> None:
        import openai

        self.client = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0, timeout=300)
        self.concurrency = concurrency
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self._counter = 0
        self._lock = threading.Lock()

    def _prompt(self) -> list[int]:
        # NOTE: a fresh random prompt per request: no prefix-cache hits, nothing the canary dedups.
        with self._lock:
            self._counter += 1
            rng = random.Random(self._counter)
        return [rng.randrange(32, 122) for _ in range(self.prompt_tokens)]

    def _one(self, into: Samples) -> None:
        start = time.perf_counter()
        stamps: list[float] = []
        stream = self.client.completions.create(model="tiny", prompt=self._prompt(), max_tokens=self.max_tokens,
                                                temperature=0, stream=True, extra_body={"ignore_eos": True})
        for chunk in stream:
            if chunk.choices and chunk.choices[0].text:
                stamps.append(time.perf_counter())
        with self._lock:
            into.ttfts.append(stamps[0] - start)
            if len(stamps) > 1:
                into.tpots.append((stamps[-1] - stamps[0]) / (len(stamps) - 1))

    def run_window(self, seconds: float) -> Samples:
        """Requests started within `seconds`; returns once the last of them has finished."""
        out = Samples()
        end = time.perf_counter() + seconds

        def worker() -> None:
            while time.perf_counter() < end:
                self._one(out)

        threads = [threading.Thread(target=worker) for _ in range(self.concurrency)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return out


class Canary:
    def __init__(self, mesh) -> None:
        import httpx

        self._http = httpx.Client(timeout=10)
        self.gateway = mesh.gateway_url
        canary = next((s for s in mesh.specs if s.service == "canary"), None)
        self.url = f"http://{canary.metrics_target}" if canary else ""

    def set_mirror(self, sample: float) -> None:
        resp = self._http.put(f"{self.gateway}/admin/mirror", json={"sample": sample},
                              headers={"Authorization": f"Bearer {ADMIN_KEY}"})
        resp.raise_for_status()

    def wait_quiet(self, timeout_s: float) -> float:
        """Waits until the canary has nothing buffered or replaying; returns the seconds waited."""
        if not self.url:
            return 0.0
        start = time.perf_counter()
        while time.perf_counter() - start < timeout_s:
            health = self._http.get(f"{self.url}/health").json()
            if health["buffered"] == 0 and health["replaying"] == 0:
                return time.perf_counter() - start
            time.sleep(0.2)
        raise TimeoutError(f"the canary still had work after {timeout_s:.0f} s: {health}")

    def report(self) -> dict:
        return self._http.get(f"{self.url}/report").json() if self.url else {}

    def gateway_metric(self, name: str) -> float:
        text = self._http.get(f"{self.gateway}/metrics").text
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--window-s", type=float, default=15.0, help="length of one on or off window")
    p.add_argument("--rounds", type=int, default=2, help="repeats of the off, on, on, off pattern")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--slowdown", type=float, default=10.0, help="how many times slower the candidate decodes")
    p.add_argument("--candidate-priority", default="idle", choices=["normal", "low", "idle"],
                   help="CPU priority of the candidate workers and the canary (kvmesh up --candidate-cpu-priority)")
    p.add_argument("--canary-buffer", type=int, default=8, help="records the canary buffers before it drops")
    p.add_argument("--no-canary", action="store_true",
                   help="diagnosis: mirror with no canary or candidate running (the tap's and NATS's own cost)")
    args = p.parse_args(argv)

    from kvmesh.runtime.launcher import MeshOptions, free_port
    from kvmesh.runtime.supervisor import Mesh

    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as run_dir:
        opts = MeshOptions(
            port=free_port(), run_dir=run_dir, kvstore=False, canary=not args.no_canary,
            candidate_prefill=0 if args.no_canary else 1, candidate_decode=0 if args.no_canary else 1,
            settings=[f"gateway.admin_key={ADMIN_KEY}", "canary.noise_sample=0",
                      f"canary.buffer_max_records={args.canary_buffer}"],
            candidate_settings=[f"decode.step_slowdown={args.slowdown}"],
            candidate_cpu_priority=args.candidate_priority,
            env={"KVMESH_TRACING": "false"},
        )
        mesh = Mesh(opts)
        mesh.start(timeout_s=180)
        try:
            load = Load(f"{mesh.gateway_url}/v1", args.concurrency, args.prompt_tokens, args.max_tokens)
            canary = Canary(mesh)
            # NOTE: a short mirrored warm-up (discarded) connects the tap to NATS and warms every path.
            canary.set_mirror(1.0)
            load.run_window(min(3.0, args.window_s))
            off, on, off_halves = Samples(), Samples(), (Samples(), Samples())
            waited = 0.0
            for _ in range(args.rounds):
                for i, mirrored in enumerate((False, True, True, False)):
                    canary.set_mirror(1.0 if mirrored else 0.0)
                    if not mirrored:
                        waited += canary.wait_quiet(timeout_s=300)
                    window = load.run_window(args.window_s)
                    (on if mirrored else off).add(window)
                    if not mirrored:
                        off_halves[0 if i == 0 else 1].add(window)
            report = canary.report()
            gateway_dropped = canary.gateway_metric("kvmesh_gateway_mirror_dropped_total")
        finally:
            mesh.stop()

    print(f"\n{args.rounds} x (off, on, on, off) windows of {args.window_s:g} s; {args.concurrency} streams, "
          f"{args.prompt_tokens} prompt tokens, {args.max_tokens} output tokens, tiny model; candidate decode "
          f"{args.slowdown:g}x slower at CPU priority {args.candidate_priority!r}\n")
    print(f"{'production traffic':36} {'requests':>8} {'TTFT p50 ms':>12} {'p99 ms':>8} {'TPOT p50 ms':>12}")
    for name, s in (("mirroring off", off), ("100% mirrored", on)):
        print(f"{name:36} {len(s.ttfts):8d} {s.pct(0.5) * 1e3:12.1f} {s.pct(0.99) * 1e3:8.1f} "
              f"{s.pct(0.5, 'tpots') * 1e3:12.2f}")
    ratio = on.pct(0.99) / off.pct(0.99)
    noise = off_halves[1].pct(0.99) / off_halves[0].pct(0.99)
    verdict = "meets" if ratio <= 1.05 else "does NOT meet"
    print(f"\nTTFT p99 ratio mirrored / off = {ratio:.3f} ({verdict} the goal: at most 5% slower)")
    print(f"other ratios mirrored / off: TTFT p50 {on.pct(0.5) / off.pct(0.5):.3f}, TPOT p50 "
          f"{on.pct(0.5, 'tpots') / off.pct(0.5, 'tpots'):.3f}, requests served {len(on.ttfts) / len(off.ttfts):.3f}")
    print(f"noise: TTFT p99 ratio between the two halves of the off windows = {noise:.3f}")
    tpot = report.get("tpot", {})
    print(f"canary: received {report.get('mirror_received')}, replayed {report.get('samples')}, "
          f"dropped {report.get('mirror_dropped')} (gateway tap dropped {gateway_dropped:g}); candidate TPOT p50 "
          f"{tpot.get('candidate_p50_s', 0) * 1e3:.1f} ms vs production {tpot.get('production_p50_s', 0) * 1e3:.1f} ms; "
          f"verdict {report.get('verdict')}: {report.get('reason')}")
    print(f"waited {waited:.0f} s for the canary to go quiet before off windows; wall time "
          f"{time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
