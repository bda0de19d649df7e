"""`kvmesh sim calibrate --url GATEWAY [--model NAME]`: measures a running mesh from the outside,
through its gateway, and prints the `kvmesh sim` flags that reproduce it (model: meshcal.py).

Probes, in order (prompts are random token ids with a per-run nonce, so nothing is cached unless
a probe means it to be):
1. TTFT of lone requests against uncached prompt length (median of `repeats` per length);
2. prefix hits: a long prompt, then 0.2 s later the same again, or its first part followed by
   `hit_new_tokens` new ones; the second TTFT, less that of a fresh prompt of its uncached tokens
   sent right after it, against its cached tokens and its (new, cached) token pairs;
3. ITL against the number of concurrent streams (short prompts, `stream_tokens` each): the mean
   gap while all k streams decode, median over streams, then over `repeats` runs; then
   `context_streams` streams with long prompts: how much slower they decode is the context's cost;
4. CPU sharing: while k streams decode (k in `stall_streams`, 0 included, taking turns), one
   uncached prompt of each of `stall_lengths` arrives; its TTFT against the lone one's at that
   length, and the streams' largest gap during its prefill against their ITL;
5. request work: `burst` short requests (one output token) at once; how much later than a lone
   request's the last first token comes;
6. with `workers` > 1 (the decode workers behind the gateway, on one host): that many long
   uncached prompts at once, one per worker; how much later than a lone one's the last first
   token comes is how the host shares its CPU between busy workers;
7. admission (`--admission-probe N`): N streams at once; those with a first token before the
   first finish were admitted together.
With `--engine-model`, the in-process engine (`calibrate.py`) is measured too, after the
probes, and printed as a lower bound.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import statistics
import time
from dataclasses import dataclass

from .calibrate import lower_bound
from .client import Target, new_client, served_model, stream_one, unreachable
from .meshcal import (
    Samples, admitted_before_first_finish, beside_medians, describe, fit, itl_point, largest_gap, steady_itl,
)
from .replay import VOCAB
from .report import Outcome


@dataclass(frozen=True, slots=True)
class ProbeConfig:
    lengths: tuple[int, ...] = (64, 256, 512, 1024, 1536)
    repeats: int = 3
    streams: tuple[int, ...] = (1, 4, 8, 16)
    stream_tokens: int = 64
    stall_streams: tuple[int, ...] = (0, 8, 16, 32)  # streams decoding beside a prefill (0: its lone TTFT)
    stall_lengths: tuple[int, ...] = (512, 1536)     # uncached prompt lengths of that prefill
    context_streams: int = 8          # long-prompt streams for the decode step's context cost (0 = skip)
    burst: int = 24
    hit_pause_s: float = 0.2          # between a prompt and its repeat (the prefix-hit probe)
    hit_new_tokens: tuple[int, ...] = (512,)  # new tokens after a cached prefix (the hit probe's second shape)
    workers: int = 1                  # decode workers behind the gateway (> 1: probe how they share the host)
    admission_probe: int = 0          # burst size; 0 = skip the probe


class _Prompts:
    """Random token-id prompts that no earlier run (or probe) has sent."""

    def __init__(self) -> None:
        self._rng = random.Random(os.urandom(16))

    def __call__(self, n: int) -> list[int]:
        return [self._rng.randrange(*VOCAB) for _ in range(n)]


async def probe(target: Target, config: ProbeConfig) -> Samples:
    """Runs the probes against the mesh behind `target`; returns what they measured."""
    async with new_client(target) as client:
        prober = _Prober(client, target, await served_model(client, target), config)
        for _ in range(3):
            await prober.one(prober.prompt(32), 4)  # warm-up
        await prober.ttft()
        await prober.hits()
        await prober.itl()
        for _ in range(config.repeats):
            # NOTE: stream counts and lengths take turns (as in ttft()), so the host's noise bends no one point
            for k in config.stall_streams:
                for n in config.stall_lengths:
                    prober.samples.stall.append(await prober.stall(k, n))
            prober.samples.burst.append(await prober.burst())
            if config.workers > 1:
                prober.samples.pair.append(await prober.pair())
        prober.samples.workers = config.workers
        if config.admission_probe:
            await prober.admission()
        return prober.samples


class _Prober:
    """One method per probe (see the module docstring); each appends to `samples`."""

    def __init__(self, client, target: Target, model: str, config: ProbeConfig) -> None:  # noqa: ANN001
        self.client, self.target, self.model, self.config = client, target, model, config
        self.samples, self.prompt = Samples(), _Prompts()
        self.longest = max(config.lengths)

    async def one(self, tokens: list[int], max_tokens: int, times: list[float] | None = None) -> Outcome:
        outcome = await stream_one(self.client, self.target, self.model, tokens, max_tokens, token_times=times)
        if not outcome.ok:
            raise RuntimeError(f"calibration request failed with status {outcome.status}")
        return outcome

    async def ttft(self) -> None:
        # NOTE: the lengths take turns, so a burst of the host's noise hits them alike, not one length
        by_length: dict[int, list[tuple[float, float]]] = {n: [] for n in self.config.lengths}
        for _ in range(self.config.repeats):
            for n in self.config.lengths:
                o = await self.one(self.prompt(n), 2)
                by_length[n].append((n - o.cached_tokens, o.ttft_s))
        for points in by_length.values():
            self.samples.ttft_raw += points
            self.samples.ttft.append((statistics.median(p[0] for p in points), statistics.median(p[1] for p in points)))

    async def hits(self) -> None:
        # NOTE: two shapes taking turns: the whole prompt again (the cost per cached token), and a
        # cached prefix followed by new tokens (their attention over the cached ones)
        news = [n for n in self.config.hit_new_tokens if 0 < n < self.longest]
        shapes = [(self.longest, 0), *((self.longest - n, n) for n in news)]
        for _ in range(self.config.repeats):
            for prefix, new in shapes:
                first = self.prompt(prefix)
                await self.one(first, 2)
                # NOTE: a trace's hits find prefixes cached long before, not while the first turn is handed back
                await asyncio.sleep(self.config.hit_pause_s)
                again = await self.one(first + self.prompt(new), 2)
                uncached = prefix + new - again.cached_tokens
                lone = await self.one(self.prompt(max(1, uncached)), 2)  # the same noise, no hit
                self.samples.hit.append((again.cached_tokens, uncached, again.ttft_s))
                self.samples.hit_lone.append(lone.ttft_s)

    async def itl(self) -> None:
        itls: dict[int, list[float]] = {k: [] for k in self.config.streams}
        for _ in range(self.config.repeats):
            for k in self.config.streams:  # taking turns, as in ttft()
                itls[k].append(await self.steady(k, 32))
        self.samples.itl += [(k, statistics.median(values)) for k, values in itls.items()]
        self.samples.itl_context = 32 + self.config.stream_tokens / 2
        k = self.config.context_streams
        if k:
            long = [await self.steady(k, self.longest) for _ in range(self.config.repeats)]
            self.samples.itl_long.append((k, self.longest + self.config.stream_tokens / 2, statistics.median(long)))

    async def steady(self, k: int, prompt_tokens: int) -> float:
        """The ITL of k streams with `prompt_tokens`-token prompts, sent at once (see steady_itl)."""
        times: list[list[float]] = [[] for _ in range(k)]
        run = await asyncio.gather(*(self.one(self.prompt(prompt_tokens), self.config.stream_tokens, t) for t in times))
        steady = steady_itl(times, [o.output_tokens for o in run])
        return steady if not math.isnan(steady) else itl_point(k, [o.itl_s for o in run])[1]

    async def stall(self, streams: int, tokens: int) -> tuple[float, float, float, float, float]:
        """(prefill tokens, streams, the largest gap of any during the prefill, their median ITL, its TTFT)
        for an uncached prompt of `tokens` arriving while `streams` streams decode (0: alone)."""
        times: list[list[float]] = [[] for _ in range(streams)]
        tasks = [asyncio.create_task(self.one(self.prompt(16), 4 * self.config.stream_tokens, t)) for t in times]
        for _ in range(2000):  # until every stream has a few tokens (bounded: 20 s)
            if all(len(t) >= 4 for t in times):
                break
            await asyncio.sleep(0.01)
        start = time.perf_counter()
        long = await self.one(self.prompt(tokens), 1)
        outcomes = await asyncio.gather(*tasks)
        if not streams:
            return float(tokens), 0.0, 0.0, 0.0, long.ttft_s
        # NOTE: the largest gap of any stream: with several workers only those beside the prefill stall
        gap = max(largest_gap(t, start, long.first_token_s) for t in times)
        itl = statistics.median(o.itl_s for o in outcomes)
        return float(tokens), float(streams), gap, itl, long.ttft_s

    async def burst(self) -> tuple[float, float, float]:
        """(requests, prompt tokens, the last one's TTFT) for one-token requests sent at once."""
        outcomes = await asyncio.gather(*(self.one(self.prompt(32), 1) for _ in range(self.config.burst)))
        return float(self.config.burst), 32.0, max(o.ttft_s for o in outcomes)

    async def pair(self) -> tuple[float, float, float]:
        """(prompts, tokens, the last one's TTFT) for one long uncached prompt per worker, sent at once."""
        m = self.config.workers
        outcomes = await asyncio.gather(*(self.one(self.prompt(self.longest), 1) for _ in range(m)))
        return float(m), float(self.longest), max(o.ttft_s for o in outcomes)

    async def admission(self) -> None:
        # NOTE: beyond slots + queue a request gets 429; only the served ones count
        n = self.config.admission_probe
        outcomes = await asyncio.gather(*(stream_one(self.client, self.target, self.model, self.prompt(16), 24)
                                          for _ in range(n)))
        served = [o for o in outcomes if o.ok]
        self.samples.admitted = admitted_before_first_finish([o.first_token_s for o in served], [o.finish_s for o in served])
        self.samples.probe_streams = n


def beside_line(samples: Samples) -> str:
    """The CPU-sharing probe's median TTFTs, by prefill length, then streams beside it."""
    medians = beside_medians(samples.stall)
    return "prefill TTFT beside streams: " + "; ".join(
        f"{n:.0f} tokens " + ", ".join(f"{k:.0f}: {t * 1e3:.0f} ms" for (m, k), t in medians.items() if m == n)
        for n in sorted({n for n, _ in medians}))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvmesh sim calibrate", description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True, help="gateway base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", default="", help="model name (default: the gateway's first in /v1/models)")
    p.add_argument("--api-key", default="")
    p.add_argument("--lengths", default="64,256,512,1024,1536", help="uncached prompt lengths for the TTFT probe")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--streams", default="1,4,8,16", help="concurrent stream counts for the ITL probe")
    p.add_argument("--stream-tokens", type=int, default=64, help="output tokens per stream in the ITL probe")
    p.add_argument("--stall-streams", default="0,8,16,32", help="stream counts decoding beside the CPU-sharing probe's prefill")
    p.add_argument("--stall-lengths", default="512,1536", help="uncached prompt lengths of that prefill")
    p.add_argument("--workers", type=int, default=1,
                   help="decode workers behind the gateway; > 1 also probes how they share one host's CPU")
    p.add_argument("--admission-probe", type=int, default=0,
                   help="send this many streams at once to find the admission limit (0 = skip; use > the expected limit)")
    p.add_argument("--engine-model", default="",
                   help="also measure the in-process engine on this model (tiny or a directory): a lower bound")
    return p


def calibrate_main(argv: list[str] | None = None) -> int:
    """Entry point for `kvmesh sim calibrate`."""
    args = build_parser().parse_args(argv)
    config = ProbeConfig(
        lengths=tuple(int(x) for x in args.lengths.split(",")), repeats=args.repeats,
        streams=tuple(int(x) for x in args.streams.split(",")), stream_tokens=args.stream_tokens,
        admission_probe=args.admission_probe, workers=args.workers,
        stall_streams=tuple(int(x) for x in args.stall_streams.split(",")),
        stall_lengths=tuple(int(x) for x in args.stall_lengths.split(",")),
    )
    target = Target(args.url.rstrip("/"), args.model, args.api_key)
    t0 = time.perf_counter()
    try:
        samples = asyncio.run(probe(target, config))
    except Exception as exc:  # noqa: BLE001 - only the gateway's failures are turned into a message
        if not (unreachable(exc) or isinstance(exc, RuntimeError)):
            raise
        raise SystemExit(f"kvmesh sim calibrate: {target.url}: {exc}") from None
    lower = lower_bound(args.engine_model) if args.engine_model else None
    cal = fit(samples, lower["decode_s_per_seq"] if lower else None)
    print(f"# kvmesh sim calibrate: {target.url}, probes took {time.perf_counter() - t0:.0f} s "
          f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
    print("# TTFT by uncached prompt tokens: " + ", ".join(f"{n:.0f}: {t * 1e3:.1f} ms" for n, t in samples.ttft))
    print("# ITL by concurrent streams:      " + ", ".join(f"{k:.0f}: {t * 1e3:.2f} ms" for k, t in samples.itl))
    print("# " + beside_line(samples))
    for line in describe(cal, lower):
        print(line)
    print("kvmesh sim " + " ".join(cal.sim_flags()))
    return 0

