"""The probes of `kvmesh sim calibrate --url GATEWAY` (shell: meshcalcli.py): they measure a running
mesh from the outside, through its gateway, for the model in meshcal.py.

Probes, in order (prompts are random token ids with a per-run nonce, so nothing is cached unless a
probe means it to be). Every prompt whose prefill is timed (probes 1, 2, 5, 8; 3's first) has a length no
earlier probe request had, a few tokens past its point's nominal length, as a trace's prompts have
(`_Prober.unseen`; beside k decoding streams the step's count is length + k, and that is what must
be new): the engine's CPU kernels are built and cached per token count, and a prefill of a new count
took ~4 ms longer (704 cached + 200 new tokens on tiny: 17.7 ms with 200 every time, 21.8 with a new
count each time), which the repeated lengths never paid and the trace's requests nearly all did;
probe 3 measures that cost (`prefill_s_new_shape`), which the fit takes out of the lone requests'
per-request terms. The request-work burst (6) keeps one length, as run AD measured it (its
`request_busy_s` came out 2.5 ms; whether new lengths there move it was not separated), and the
fit takes its steps as run at counts seen before. Each request
still opens its own connection (client.py says why). Each probe point runs `repeats` times, the
points of a probe taking turns, and up to `extra_repeats` more times while its repeats disagree
(`spread_limit`); the fit takes each point's median. Every run starts `settle_s` after the one
before, so it finds the worker done handing the last run's turns back to the KV store (a lone
stream's ITL read 2.82 ms right after 16 streams of 1,024-token prompts, 1.12 ms quiet and 1.15 ms
0.3 s later), and then, like every request timed after a pause, right after an untimed short one
(`wake_tokens`), so that it finds the mesh's processes awake, as a loaded mesh has them (`_Prober.woken`
says why):
1. TTFT of lone requests against uncached prompt length;
2. prefix hits: a long prompt, then 0.2 s later (and a waker) the same again, or its first part followed by
   `hit_new_tokens` new ones; the second TTFT, less that of a fresh prompt of its uncached tokens
   sent right after it, against its cached tokens and its (new, cached) token pairs;
3. new shapes: a lone fresh prompt of a token count never sent (`shape_tokens`, a new count each
   run), then `settle_s` later another fresh prompt of that count; the first's TTFT less the
   second's is what building the kernels for a new count costs (`prefill_s_new_shape`);
4. ITL against the number of concurrent streams (short prompts, `stream_tokens` each; k streams per
   decode worker, k × `workers` in all where k > 1): the mean gap while all of them decode, median
   over streams; taking turns with them, `context_points` (streams per worker, prompt tokens) with
   long prompts: how much slower they decode, against their padded KV tokens, is the context's cost;
5. CPU sharing: while k streams decode (k in `stall_streams`, 0 included, taking turns), one
   uncached prompt of each of `stall_lengths` arrives; its TTFT against the lone one's at that
   length, and the streams' largest gap during its prefill against their ITL;
6. request work: `burst` short requests (one output token) at once; how much later than a lone
   request's the last first token comes;
7. KV hand-back (handback.py): k turns of t tokens per worker at once (`handback_points`), then a
   lone stream of `handback_lone_tokens` right after they end and another `settle_s` later; the
   first's extra latency over the second's is what handing those turns back cost the worker;
8. with `workers` > 1 (the decode workers behind the gateway, on one host): that many long
   uncached prompts at once, one per worker; how much later than a lone one's the last first
   token comes is how the host shares its CPU between busy workers;
9. admission (`--admission-probe N`): N streams at once; those with a first token before the
   first finish were admitted together;
10. visibility (run right after 1): `visible_requests` lone requests; how many tokens each streamed
   before its first visible text (`hidden_tokens`). The gateway sends no chunk for a token whose
   text is held back (a byte of an unfinished UTF-8 character, a skipped special token), so a
   client's TTFT is its first *visible* token's; the built-in tiny model, a byte-level vocabulary
   with random weights, showed text at the first token in 32 of 60 greedy requests and 1-4 tokens
   later in the rest. Probes 1-3 ask for logprobs so that they time the first token itself; the
   sim adds the hidden tokens' decode steps (cluster.py), which grow with the load.
11. host load (when the engines run on this host: hostcpu.py; one worker too): at each of
   `host_points` (streams per worker, tokens each), that many streams at once; the host's busy CPU
   outside the engines (the gateway, scheduler, workers' RPC loops, KV store and this client) against
   their requests, the busy workers' engine steps and the streamed tokens (`host_cpu_s_per_request`,
   `_per_step`, `_per_token`), which takes from the cores the busy workers share.
12. path load (run before 11; `load_rates`, empty: skip): one of `load_prefixes` prefixes (one per
   decode worker by default) of `load_prefix_tokens`, each cached by a request before them, those sent
   at once so the workers share them, then `load_fresh_tokens` fresh ones (a multi-turn trace's later turn), at
   Poisson arrivals whose rate steps between `load_rates` every `load_block_s` (`load_seconds` each in
   all), `repeats` runs, after a few of them one at a time; each request's rate, arrival, lengths and
   TTFT (pathload.py fits how a request's path slows with the traffic: `request_s_per_rps`); and, when
   the engines run on this host, the host's CPU outside them over each run (printed: what a
   trace-like request costs the host; meshcal.fit_path_load says why it is not fitted).
With `--engine-model`, the in-process engine (`calibrate.py`) is measured too, after the
probes, and printed as a lower bound.
"""

from __future__ import annotations

import asyncio
import math
import os
import random
import statistics
import time
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from functools import partial
from typing import Any

from . import hostcpu
from .client import Target, new_client, served_model, stream_one
from .meshcal import Samples
from .meshstats import unsettled
from .meshstreams import admitted_before_first_finish, itl_point, largest_gap, steady_run
from .pathload import LONE_RUN, stepped_arrivals
from .replay import VOCAB
from .report import Outcome

BLOCK_TOKENS = 16  # the mesh's KV block: a cached prefix is a whole number of them
LOAD_LONE_REQUESTS = 5  # the path-load probe's lone requests, one at a time, before its runs


@dataclass(frozen=True, slots=True)
class ProbeConfig:
    lengths: tuple[int, ...] = (64, 256, 512, 1024, 1536)
    repeats: int = 3
    streams: tuple[int, ...] = (1, 4, 8, 16)      # per decode worker, as are context_points' streams
    stream_tokens: int = 64
    stall_streams: tuple[int, ...] = (0, 2, 8, 16, 32)  # streams decoding beside a prefill (0: its lone TTFT)
    stall_lengths: tuple[int, ...] = (512, 1536)     # uncached prompt lengths of that prefill
    # (streams, prompt tokens) of the long-context ITL points (decodectx.py), one per (streams, length) pair:
    # streams × context, 4k to 37k padded KV tokens, four of them around the knee (~4-8k on tiny) where
    # the trace's steps are, two far past it so the slope is not set by the points near the knee alone
    context_points: tuple[tuple[int, int], ...] = ((4, 1024), (8, 512), (4, 1536), (8, 768), (8, 1024), (8, 1536), (16, 1024),
                                                   (16, 1536), (24, 1536))
    # (turns per worker, prompt tokens) of the KV hand-back probe: two turn lengths tell its per-turn
    # cost from its per-token one
    handback_points: tuple[tuple[int, int], ...] = ((16, 64), (16, 1024))
    handback_lone_tokens: int = 256   # the lone stream after them: long enough to outlast their hand-back
    settle_s: float = 0.3             # before every probe run (see the module docstring)
    burst: int = 24
    hit_pause_s: float = 0.2          # between a prompt and its repeat (the prefix-hit probe)
    # an untimed prompt of this many tokens (one output token) after every pause (`_Prober.woken`); 0: none
    wake_tokens: int = 8
    hit_new_tokens: tuple[int, ...] = (512,)  # new tokens after a cached prefix (the hit probe's second shape)
    shape_tokens: tuple[int, ...] = (128, 384)  # uncached prompt lengths of the new-shape probe's pairs (empty: skip)
    # lone requests whose tokens before the first visible text are counted (the visibility probe)
    visible_requests: int = 24
    visible_prompt_tokens: int = 64
    visible_tokens: int = 16
    workers: int = 1                  # decode workers behind the gateway (> 1: probe how they share the host)
    # the host-load probe's points (11): (streams per worker, tokens each), sent at once on 32-token
    # prompts; tokens per request vary apart from requests, and steps from tokens
    host_points: tuple[tuple[int, int], ...] = ((1, 256), (4, 256), (8, 256), (8, 32))
    admission_probe: int = 0          # burst size; 0 = skip the probe
    # the path-load probe (12): a shared prefix then fresh tokens (a trace's later turn), at Poisson
    # arrivals whose rate steps between `load_rates`, each a fraction of 1 / a lone request's TTFT at
    # that length (~9-26 req/s on tiny here); empty: skip
    load_rates: tuple[float, ...] = (0.15, 0.3, 0.45)
    load_seconds: float = 6.0         # per rate, in blocks of `load_block_s` that step between the rates
    load_block_s: float = 2.0
    load_prefix_tokens: int = 768
    # shared prefixes, each cached by its own request, all sent at once so the scheduler spreads them
    # over the workers; the runs' requests take them in turn (0: one per decode worker)
    load_prefixes: int = 0
    load_fresh_tokens: int = 192
    load_output_tokens: int = 48
    extra_repeats: int = 4            # more repeats, at most, of a probe point whose repeats disagree
    spread_limit: float = 0.15        # ... by more than this (half the interquartile range over the median)


class FreshPrompts:
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
        await prober.visible()
        await prober.hits()
        await prober.shapes()
        await prober.itl()
        await prober.handback()
        await prober.sharing()
        await prober.path_load()
        await prober.host_load()
        prober.samples.workers = config.workers
        if config.admission_probe:
            await prober.admission()
        return prober.samples


class _Prober:
    """One method per probe (see the module docstring); each appends to `samples`."""

    def __init__(self, client, target: Target, model: str, config: ProbeConfig,  # noqa: ANN001
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.client, self.target, self.model, self.config = client, target, model, config
        self.sleep = sleep
        self.samples, self.prompt = Samples(), FreshPrompts()
        self.longest = max(config.lengths)
        self.lengths_sent: set[int] = set()

    def unseen(self, n: int, rows: int = 0) -> int:
        """The shortest prompt length from n up whose prefill step, beside `rows` decoding streams,
        has a token count (length + rows) no timed probe step had so far (see the module docstring);
        the point keeps its nominal n."""
        while n + rows in self.lengths_sent:
            n += 1
        self.lengths_sent.add(n + rows)
        return n

    async def paused(self, seconds: float) -> None:
        """Waits `seconds` (none at 0), then wakes the mesh (woken): what every request timed after a pause follows."""
        if seconds > 0:
            await self.sleep(seconds)
        await self.woken()

    async def woken(self) -> None:
        """An untimed request of `wake_tokens` fresh tokens and one output token, so that the timed one sent
        right after it finds the mesh's processes awake.

        NOTE: a request sent after the mesh idled 0.2-0.3 s takes ~4-5 ms longer than one sent right after
        another (tiny, 1 worker, 12 pairs each, medians: a whole 1,520-token prompt again 21.1 ms after a
        pause, 16.3 right after a fresh 16-token one; that fresh one 17.0 after a pause, 14.3 right after the
        repeat). Sent as the hit probe sent them (the repeat after a pause, its fresh twin right after it), the
        hit read 8.3 ms; with both after a pause 3.2-3.7 ms, with a waker before the repeat 3.7. The lone
        TTFTs came after a pause too, and the trace's requests, among others, never pay it (stop 47 saw it
        as the path-load probe's lone requests reading 6-7 ms over its lowest rate, pathload.py).
        NOTE: in the calibration itself (runs CE, CF, with wakers) the 1,520-token hit still read ~6-7 ms,
        as in runs BZ-CD without them: there every repeat's and twin's token count is new (kernels built),
        which the pairs above were not; what is left of the gap is not the pause."""
        if self.config.wake_tokens > 0:
            self.lengths_sent.add(self.config.wake_tokens)  # NOTE: its kernels are built now: no timed prefill may take that count
            await self.one(self.prompt(self.config.wake_tokens), 1)

    def unseen_tail(self) -> int:
        """A last-block length (1..BLOCK_TOKENS) no timed prefill has had yet, else a full block: what a
        whole prompt sent again prefills."""
        for n in range(1, BLOCK_TOKENS):
            if n not in self.lengths_sent:
                self.lengths_sent.add(n)
                return n
        return BLOCK_TOKENS

    async def one(self, tokens: list[int], max_tokens: int, times: list[float] | None = None,
                  hidden: list[int] | None = None) -> Outcome:
        """One request; with `hidden`, timed to its first token, visible or not (client.stream_one)."""
        outcome = await stream_one(self.client, self.target, self.model, tokens, max_tokens, token_times=times,
                                   hidden=hidden)
        if not outcome.ok:
            raise RuntimeError(f"calibration request failed with status {outcome.status}")
        return outcome

    def per_worker(self, streams: int) -> int:
        """`streams` streams on each decode worker (one stream is one): with several workers the
        per-stream terms then get the signal they get on one."""
        return streams if streams <= 1 else streams * self.config.workers

    async def repeated(self, runs: dict[Hashable, Callable[[], Awaitable[Any]]],
                       value: Callable[[Any], float]) -> dict[Hashable, list[Any]]:
        """Every probe point `repeats` times, the points taking turns, then again while their repeats
        disagree (the `value` of each: relative_spread > `spread_limit`), at most `extra_repeats`
        more times each; the records of each point's runs."""
        # NOTE: taking turns, a burst of the host's noise hits a few repeats of several points, not every
        # repeat of one; a point whose repeats still disagree (a burst hit two of five) gets more of them
        # NOTE: a run that measured nothing (None: host_run's engine restarted meanwhile) is dropped
        records: dict[Hashable, list[Any]] = {key: [] for key in runs}
        for _ in range(self.config.repeats):
            for key, run in runs.items():
                if (record := await self.settled(run)) is not None:
                    records[key].append(record)
        for _ in range(self.config.extra_repeats):
            for key in unsettled({k: [value(r) for r in rs] for k, rs in records.items()}, self.config.spread_limit):
                if (record := await self.settled(runs[key])) is not None:
                    records[key].append(record)
                self.samples.reprobed.append(str(key))
        return records

    async def settled(self, run: Callable[[], Awaitable[Any]]) -> Any:
        """`run` once, `settle_s` after the run before it ended (the module docstring says why)."""
        await self.paused(self.config.settle_s)
        return await run()

    async def ttft(self) -> None:
        async def lone(n: int) -> tuple[float, float]:
            o = await self.one(self.prompt(self.unseen(n)), 2, hidden=[])
            return n - o.cached_tokens, o.ttft_s

        records = await self.repeated({n: partial(lone, n) for n in self.config.lengths}, lambda r: r[1])
        self.samples.ttft += [point for points in records.values() for point in points]

    async def visible(self) -> None:
        """The visibility probe: lone requests, each the number of tokens before its first text."""
        for _ in range(self.config.visible_requests):
            await self.one(self.prompt(self.config.visible_prompt_tokens), self.config.visible_tokens,
                           hidden=self.samples.visible)

    async def shapes(self) -> None:
        """The new-shape probe: (nominal tokens, TTFT at a count never sent, TTFT at that count again)."""
        async def pair(n: int) -> tuple[float, float, float]:
            count = self.unseen(n)
            cold = await self.one(self.prompt(count), 2, hidden=[])
            await self.paused(self.config.settle_s)  # NOTE: not right after the first: its turn's hand-back
            warm = await self.one(self.prompt(count), 2, hidden=[])
            return float(n), cold.ttft_s, warm.ttft_s

        records = await self.repeated({("shape", n): partial(pair, n) for n in self.config.shape_tokens}, lambda r: r[1] - r[2])
        self.samples.shape += [r for rs in records.values() for r in rs]

    async def hits(self) -> None:
        # NOTE: two shapes taking turns: the whole prompt again (the cost per cached token), and a
        # cached prefix followed by new tokens (their attention over the cached ones)
        news = [n for n in self.config.hit_new_tokens if 0 < n < self.longest]
        shapes = [(self.longest, 0), *((self.longest - n, n) for n in news)]

        async def hit(prefix: int, new: int) -> tuple[float, float, float, float]:
            # NOTE: the repeat's uncached tokens and its lone twin's are lengths not timed before (unseen):
            # a whole prompt again recomputes its last block, so that block's length varies instead
            if new:
                new = self.unseen(new)
            else:
                prefix += self.unseen_tail() - BLOCK_TOKENS
            first = self.prompt(prefix)
            self.lengths_sent.add(prefix)
            await self.one(first, 2)
            # NOTE: a trace's hits find prefixes cached long before, not while the first turn is handed back
            await self.paused(self.config.hit_pause_s)
            again = await self.one(first + self.prompt(new), 2, hidden=[])
            uncached = prefix + new - again.cached_tokens
            self.lengths_sent.add(uncached)  # the count the repeat's step prefilled (a whole prompt's: its last block)
            lone = await self.one(self.prompt(self.unseen(max(1, uncached))), 2, hidden=[])  # the same noise, no hit
            return again.cached_tokens, uncached, again.ttft_s, lone.ttft_s

        records = await self.repeated({shape: partial(hit, *shape) for shape in shapes}, lambda r: r[2])
        for cached, uncached, ttft, lone in (r for rs in records.values() for r in rs):
            self.samples.hit.append((cached, uncached, ttft))
            self.samples.hit_lone.append(lone)

    async def itl(self) -> None:
        # NOTE: the long-context streams take turns with the short ones too (a burst once took all their repeats)
        runs: dict[Hashable, Callable[[], Awaitable[float]]] = {
            self.per_worker(k): partial(self.steady, self.per_worker(k), 32) for k in self.config.streams}
        for k, tokens in self.config.context_points:
            runs[("long", k, tokens)] = partial(self.steady, self.per_worker(k), tokens)
        records = await self.repeated(runs, lambda itl: itl)
        self.samples.itl += [(key, itl) for key, itls in records.items() if not isinstance(key, tuple) for itl in itls]
        self.samples.itl_context = 32 + self.config.stream_tokens / 2
        self.samples.itl_long += [(self.per_worker(k), tokens + self.config.stream_tokens / 2, itl)
                                  for (_, k, tokens), itls in ((key, v) for key, v in records.items() if isinstance(key, tuple))
                                  for itl in itls]

    async def handback(self) -> None:
        """The KV hand-back probe (handback.py): (turns per worker, tokens per turn, extra latency) per run."""
        runs = {(k, n): partial(self.after_turns, k, n) for k, n in self.config.handback_points}
        records = await self.repeated(runs, lambda r: r[-1])
        self.samples.handback += [r for rs in records.values() for r in rs]

    async def after_turns(self, k: int, prompt_tokens: int) -> tuple[float, float, float]:
        """k turns per worker of `prompt_tokens`-token prompts at once; a lone stream right after they
        end, and one `settle_s` later: (k, tokens per turn, the first's latency less the second's)."""
        await asyncio.gather(*(self.one(self.prompt(prompt_tokens), self.config.stream_tokens)
                               for _ in range(self.per_worker(k))))
        after = await self.one(self.prompt(32), self.config.handback_lone_tokens)
        await self.paused(self.config.settle_s)
        quiet = await self.one(self.prompt(32), self.config.handback_lone_tokens)
        extra = (after.finish_s - after.arrival_s) - (quiet.finish_s - quiet.arrival_s)
        return float(k), float(prompt_tokens + self.config.stream_tokens), extra

    async def sharing(self) -> None:
        """The CPU-sharing, request-work and (several workers) host-sharing probes, taking turns."""
        # NOTE: stream counts in all, not per worker: the trace keeps a few streams per worker running, and
        # 64 beside a prefill on two workers (run J) loaded the 2-core host with their SSE traffic, which the
        # fit took as 1.9 ms per stream beside the prefill and the sim's capacity as 20 req/s (real: 30; 29 without it)
        runs: dict[Hashable, Callable[[], Awaitable[tuple]]] = {
            (k, n): partial(self.stall, k, n) for k in self.config.stall_streams for n in self.config.stall_lengths}
        runs["burst"] = self.burst
        if self.config.workers > 1:
            runs["pair"] = self.pair
        records = await self.repeated(runs, lambda r: r[-1])
        self.samples.burst += records.pop("burst")
        self.samples.pair += records.pop("pair", [])
        self.samples.stall += [r for rs in records.values() for r in rs]

    async def steady(self, k: int, prompt_tokens: int) -> float:
        """The ITL of k streams with `prompt_tokens`-token prompts, sent at once, less the mesh's pauses
        (see steady_run); with 4 or more streams per worker, the pauses and the time they were looked for
        go to `samples`."""
        times: list[list[float]] = [[] for _ in range(k)]
        run = await asyncio.gather(*(self.one(self.prompt(prompt_tokens), self.config.stream_tokens, t) for t in times))
        per_worker = k / self.config.workers if k / self.config.workers >= 4 else 0.0
        steady = steady_run(times, [o.output_tokens for o in run], per_worker)
        if per_worker and not math.isnan(steady.itl_s):
            self.samples.pause_window_s += steady.window_s * self.config.workers
            self.samples.pauses += steady.pauses_s
        return steady.itl_s if not math.isnan(steady.itl_s) else itl_point(k, [o.itl_s for o in run])[1]

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
        rows = round(streams / self.config.workers)  # about those beside it on its worker
        long = await self.one(self.prompt(self.unseen(tokens, rows)), 1)
        outcomes = await asyncio.gather(*tasks)
        if not streams:
            return float(tokens), 0.0, 0.0, 0.0, long.ttft_s
        # NOTE: the largest gap of any stream: with several workers only those beside the prefill stall
        gap = max(largest_gap(t, start, long.first_token_s) for t in times)
        itl = statistics.median(o.itl_s for o in outcomes)
        return float(tokens), float(streams), gap, itl, long.ttft_s

    async def burst(self) -> tuple[float, float, float]:
        """(requests, prompt tokens, the last one's TTFT) for one-token requests sent at once."""
        # NOTE: one length for all (the module docstring says why)
        outcomes = await asyncio.gather(*(self.one(self.prompt(32), 1) for _ in range(self.config.burst)))
        return float(self.config.burst), 32.0, max(o.ttft_s for o in outcomes)

    async def pair(self) -> tuple[float, float, float]:
        """(prompts, tokens, the last one's TTFT) for one long uncached prompt per worker, sent at once."""
        m = self.config.workers
        outcomes = await asyncio.gather(*(self.one(self.prompt(self.unseen(self.longest)), 1) for _ in range(m)))
        return float(m), float(self.longest), max(o.ttft_s for o in outcomes)

    async def path_load(self) -> None:
        """The path-load probe: (run, rate level, arrival s, prefix tokens, fresh tokens, output tokens,
        shared prefix index, TTFT s) per request (pathload.py); each shared prefix is cached by a
        request before them all, the prefixes' requests sent at once."""
        if not self.config.load_rates:
            return
        # NOTE: one prefix per worker: with one, kv_aware kept every request of a 2-worker mesh's probe on the
        # worker that cached it (191 of 191 at 20 req/s) where the sim spilled 13% to the other, and the fit
        # read the difference as the request path slowing (run BO: 0.5 ms per req/s, 0.126 at 1 worker); with
        # two, sent at once, both split 96 / 96 and 95 / 95, as the trace's system prompts spread
        prefixes = [self.prompt(self.config.load_prefix_tokens) for _ in range(self.config.load_prefixes or self.config.workers)]
        fresh, out = self.config.load_fresh_tokens, self.config.load_output_tokens
        await asyncio.gather(*(self.one(prefix + self.prompt(BLOCK_TOKENS), 1) for prefix in prefixes))
        lone = [(await self.one(prefixes[0] + self.prompt(fresh), out, hidden=[])).ttft_s for _ in range(LOAD_LONE_REQUESTS)]
        length = float(len(prefixes[0]))
        self.samples.load += [(LONE_RUN, 0.0, 0.0, length, float(fresh), float(out), 0.0, t) for t in lone]
        rates = [f / statistics.median(lone) for f in self.config.load_rates]
        for run in range(self.config.repeats):
            record, cpu = await self.settled(partial(self.poisson, prefixes, rates))
            self.samples.load += [(float(run), *request) for request in record]
            if cpu is not None:
                self.samples.load_cpu.append((float(run), *cpu))

    async def poisson(self, prefixes: list[list[int]], rates: list[float]) -> tuple[list[tuple[float, ...]], tuple[float, ...] | None]:
        """Requests at Poisson arrivals whose rate steps between `rates` every `load_block_s`, each rate
        `load_seconds` in all (the rates in a new random order each cycle), each one of `prefixes` in
        turn then fresh tokens: (rate level, arrival s, prefix tokens, fresh tokens, output tokens, its
        prefix's index, TTFT s) of each that was served, timed to its first token; and (requests served,
        tokens streamed, the host's CPU s outside the engines meanwhile), None when no engine is on this
        host (hostcpu.py)."""
        fresh, out, block = self.config.load_fresh_tokens, self.config.load_output_tokens, self.config.load_block_s
        arrivals = stepped_arrivals(rates, max(1, round(self.config.load_seconds / block)), block, random.Random(os.urandom(8)))
        start = time.perf_counter()

        async def one(at: float, prefix: list[int]) -> Outcome:
            await self.sleep(max(0.0, start + at - time.perf_counter()))
            return await stream_one(self.client, self.target, self.model, prefix + self.prompt(fresh), out, hidden=[])

        before = hostcpu.read()
        outcomes = await asyncio.gather(*(one(a, prefixes[k % len(prefixes)]) for k, (a, _) in enumerate(arrivals)))
        outside = hostcpu.outside_engines_s(before, hostcpu.read())
        served = [o for o in outcomes if o.ok]
        cpu = None if outside is None else (float(len(served)), float(sum(o.output_tokens for o in served)), outside)
        # NOTE: the sim is run on these arrival times; a request's TTFT counts from its send, as replay's do
        return [(float(level), a, float(len(prefixes[0])), float(fresh), float(out), float(k % len(prefixes)), o.ttft_s)
                for k, ((a, level), o) in enumerate(zip(arrivals, outcomes, strict=True)) if o.ok], cpu

    async def host_load(self) -> None:
        """The host-load probe: (requests, engine steps, tokens, the host's CPU seconds outside the
        engines) per run; nothing when the first run finds no engine on this host (hostcpu.py)."""
        if not self.config.host_points or await self.host_run(*self.config.host_points[0]) is None:
            return
        records = await self.repeated({p: partial(self.host_run, *p) for p in self.config.host_points}, lambda r: r[3] / r[0])
        self.samples.host += [r for rs in records.values() for r in rs]

    async def host_run(self, per_worker: int, tokens: int) -> tuple[float, float, float, float] | None:
        """`per_worker` streams per decode worker of `tokens` tokens each, at once, with the host's CPU
        read before and after; a busy worker steps once per token of its streams.

        NOTE: streams, not trace-like turns: a turn's cost outside the engines is mostly per engine
        step (on 2 workers 0.62 of a core with one stream each, 0.87 with eight; paced turns of 48
        tokens cost 44-72 ms each at 8 a second, 22-36 at ~25 a second, as more rows share a step)."""
        n = per_worker * self.config.workers
        before = hostcpu.read()
        outcomes = await asyncio.gather(*(self.one(self.prompt(32), tokens) for _ in range(n)))
        outside = hostcpu.outside_engines_s(before, hostcpu.read())
        if outside is None:
            return None
        streamed = sum(o.output_tokens for o in outcomes)
        return float(n), float(self.config.workers * max(o.output_tokens for o in outcomes)), float(streamed), outside

    async def admission(self) -> None:
        # NOTE: beyond slots + queue a request gets 429; only the served ones count
        n = self.config.admission_probe
        outcomes = await asyncio.gather(*(stream_one(self.client, self.target, self.model, self.prompt(16), 24)
                                          for _ in range(n)))
        served = [o for o in outcomes if o.ok]
        self.samples.admitted = admitted_before_first_finish([o.first_token_s for o in served], [o.finish_s for o in served])
        self.samples.probe_streams = n
