"""`kvmesh sim replay TRACE --url GATEWAY`: sends a trace to a real mesh at its arrival times and
prints the same figures `kvmesh sim` prints for it.

Prompts are token ids built from the trace's `hash_ids`: block i of a prompt is `block_tokens`
pseudo-random ids seeded by `hash_ids[i]` alone, so two prompts share their first k blocks
exactly when they share their first k hash ids (the trace's chained meaning) and the mesh's own
block hashes see the same sharing. Tokens past the last hash id are seeded by the request id
(unique). Mooncake traces name a block per 512 tokens: pass `--block-tokens 512`. Every replay
salts those seeds afresh (`--salt` fixes it), so a replay finds nothing an earlier one left in the
mesh's caches, as the simulator, which starts empty, assumes.

NOTE: a turn's `output_hash_ids` cannot be honoured: the model writes its own output, so the next
turn's prompt (built from hash ids) does not contain it. Simulate such a trace with
`--no-output-blocks` (or strip them) when comparing with a replay.

Why not guidellm's replay profile (guidellm 0.8, from its documentation; not run here): it
replays timestamps (with a time scale) and synthesizes *text* prompts of each row's length,
Mooncake `hash_ids` mapped to shared text. Our gateway re-tokenizes that text, so a shared hash
id is not guaranteed to be a shared 16-token block of the mesh's block hashes, which is what
prefix-aware routing sees; its documented trace formats carry no session id; and it reports in
its own format, while this comparison needs per-request outcomes in the sim's table, with
goodput under the same SLO. Token-id prompts through our own gateway are simpler and exact.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import time
from dataclasses import dataclass

from .client import CLIENT_ERROR, Target, new_client, served_model, stream_one, unreachable
from .report import DETAIL_HEADER, HEADER, Outcome, RunSummary, detail_row, figures, row
from .trace import TraceRequest, mean_rate, read_jsonl, scale_rate

VOCAB = (32, 127)   # printable ASCII ids: valid in byte-level and in every BPE vocabulary we serve


def block_token_ids(hash_id: int, block_tokens: int, vocab: tuple[int, int] = VOCAB, salt: str = "") -> list[int]:
    """The tokens of the block named `hash_id` (the same for every request of a replay; for every
    replay with the same `salt`)."""
    rng = random.Random(f"{salt}/{hash_id}" if salt else hash_id)
    return [rng.randrange(*vocab) for _ in range(block_tokens)]


def prompt_token_ids(request: TraceRequest, block_tokens: int = 16, vocab: tuple[int, int] = VOCAB,
                     salt: str = "") -> list[int]:
    """`request.prompt_tokens` ids: one block per hash id (the last one cut to fit), then tokens
    of this request alone; another `salt` gives every block and tail other tokens."""
    ids: list[int] = []
    for h in request.hash_ids:
        if len(ids) >= request.prompt_tokens:
            break
        ids += block_token_ids(h, block_tokens, vocab, salt)[: request.prompt_tokens - len(ids)]
    rng = random.Random(f"tail/{salt}/{request.request_id}" if salt else f"tail/{request.request_id}")
    ids += [rng.randrange(*vocab) for _ in range(request.prompt_tokens - len(ids))]
    return ids


@dataclass(frozen=True, slots=True)
class ReplayConfig:
    target: Target
    block_tokens: int = 16
    vocab: tuple[int, int] = VOCAB
    start_delay_s: float = 0.5
    # NOTE: None = a fresh salt every replay, so a second replay of a trace is not served from the prefix
    # cache and KV store the first one filled (it was: 0.99 of its prompt tokens hit against 0.81, and the
    # sim, which starts empty, then looked 10-40% pessimistic); a fixed salt repeats the prompts exactly
    salt: str | None = None


async def replay(trace: list[TraceRequest], config: ReplayConfig) -> list[Outcome]:
    """Sends every request at its `arrival_s` (open loop: a late answer never delays the next
    send); outcomes' times are seconds on the trace's clock, each from the moment its request was
    sent (`sent_late` gives how late that was)."""
    # NOTE: TTFT counts from the send, as the calibration's probes count it: asyncio's timers wake
    # 1-1.7 ms late at the median here (the fidelity trace at 2 and 6 req/s), which, counted from the
    # trace's arrival time, was ~6% of a TTFT the simulator has no term for
    salt = os.urandom(8).hex() if config.salt is None else config.salt
    prompts = [prompt_token_ids(r, config.block_tokens, config.vocab, salt) for r in trace]
    async with new_client(config.target) as client:
        model = await served_model(client, config.target)
        t0 = time.perf_counter() + config.start_delay_s - (trace[0].arrival_s if trace else 0.0)

        def clock() -> float:
            return time.perf_counter() - t0

        async def one(r: TraceRequest, prompt: list[int]) -> Outcome:
            await asyncio.sleep(max(0.0, r.arrival_s - clock()))
            try:
                return await asyncio.wait_for(
                    stream_one(client, config.target, model, prompt, r.output_tokens, r.session_id, clock=clock),
                    config.target.timeout_s)
            except asyncio.TimeoutError:
                return Outcome(r.arrival_s, len(prompt), r.output_tokens, math.nan, clock(), 0, CLIENT_ERROR)

        return list(await asyncio.gather(*(one(r, p) for r, p in zip(trace, prompts, strict=True))))


def sent_late(trace: list[TraceRequest], outcomes: list[Outcome]) -> list[float]:
    """How much later than its arrival time each request was sent, in seconds (outcomes in trace order)."""
    return [o.arrival_s - r.arrival_s for r, o in zip(trace, outcomes, strict=True)]


def replay_summary(label: str, num_workers: int, trace: list[TraceRequest], outcomes: list[Outcome],
                   slo_ttft_s: float, warmup_s: float = 0.0) -> RunSummary:
    """The sim's figures for a replay: over requests arriving from `warmup_s` after the first."""
    start = trace[0].arrival_s + warmup_s
    return figures(label, num_workers, outcomes, (start, trace[-1].arrival_s + 1e-9), slo_ttft_s)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvmesh sim replay", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace", help="JSONL trace: `kvmesh sim --write-trace` rows or Mooncake rows")
    p.add_argument("--url", required=True, help="gateway base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", default="", help="model name (default: the gateway's first in /v1/models)")
    p.add_argument("--api-key", default="")
    p.add_argument("--rate-scale", type=float, default=1.0, help="arrival-rate factor (2 = twice as fast)")
    p.add_argument("--rate", type=float, default=0.0, help="scale the trace to this mean rate, requests/s (overrides --rate-scale)")
    p.add_argument("--block-tokens", type=int, default=16, help="tokens per hash id (16 for our traces, 512 for Mooncake)")
    p.add_argument("--max-requests", type=int, default=0, help="replay only the first N requests (0 = all)")
    p.add_argument("--warmup-s", type=float, default=0.0, help="figures start this long after the first arrival")
    p.add_argument("--slo-ttft-s", type=float, default=0.5, help="TTFT SLO for goodput")
    p.add_argument("--timeout-s", type=float, default=120.0, help="a request not finished after this counts as error 0")
    p.add_argument("--client", choices=("raw", "httpx"), default="raw",
                   help="the HTTP client: raw (lean, HTTP/1.1 over asyncio streams; httpx for https) or httpx")
    p.add_argument("--label", default="real", help="first column of the table (e.g. the mesh's policy)")
    p.add_argument("--workers", type=int, default=1, help="decode workers of the mesh, for the table")
    p.add_argument("--salt", default=None,
                   help="build the prompts from this seed: the same salt sends the same tokens again (a warm cache); "
                   "default: a fresh one each replay, so nothing of an earlier replay is cached")
    p.add_argument("--speed-reference", default="", metavar="TTFT_S,ITL_S",
                   help="the host speed `kvmesh sim calibrate` printed: probe it again before the replay and print the "
                   "`kvmesh sim --time-scale` that matches the sim to the host's speed now (hostspeed.py)")
    return p


def load_trace(path: str, rate_scale: float = 1.0, rate: float = 0.0, max_requests: int = 0) -> list[TraceRequest]:
    """The trace at `path`, cut to `max_requests` and sped up by `rate_scale` (or to `rate` req/s)."""
    trace = read_jsonl(path)
    if max_requests:
        trace = trace[:max_requests]
    if not trace:
        raise SystemExit(f"kvmesh sim replay: {path} holds no requests")
    factor = rate / max(mean_rate(trace), 1e-9) if rate else rate_scale
    if factor <= 0:
        raise SystemExit("kvmesh sim replay: --rate-scale and --rate must be > 0")
    return scale_rate(trace, factor) if factor != 1.0 else trace


def _speed_reference(text: str):  # noqa: ANN202 - hostspeed.Speed | None, imported lazily (hostspeed imports this module)
    from .hostspeed import Speed  # noqa: PLC0415

    if not text:
        return None
    try:
        ttft_s, itl_s = (float(x) for x in text.split(","))
    except ValueError:
        raise SystemExit(f"kvmesh sim replay: --speed-reference wants TTFT_S,ITL_S, got {text!r}") from None
    if ttft_s <= 0 or itl_s <= 0:
        raise SystemExit("kvmesh sim replay: --speed-reference timings must be > 0")
    return Speed(ttft_s, itl_s)


async def _speed_now(target: Target, reference) -> str:  # noqa: ANN001 - hostspeed.Speed
    from .hostspeed import measure, speed_ratio  # noqa: PLC0415

    now = await measure(target)
    factor = speed_ratio(now, reference)
    return (f"# host speed before the replay: {now.describe()}; its time is {factor:.3g}x the "
            f"calibration's: compare with `kvmesh sim --time-scale {factor:.3g} ...`")


def replay_main(argv: list[str] | None = None) -> int:
    """Entry point for `kvmesh sim replay`."""
    args = build_parser().parse_args(argv)
    try:
        trace = load_trace(args.trace, args.rate_scale, args.rate, args.max_requests)
    except (OSError, ValueError) as exc:
        raise SystemExit(f"kvmesh sim replay: {exc}") from None
    target = Target(args.url.rstrip("/"), args.model, args.api_key, args.timeout_s, args.client)
    try:
        reference = _speed_reference(args.speed_reference)
        speed_line = asyncio.run(_speed_now(target, reference)) if reference else ""
        outcomes = asyncio.run(replay(trace, ReplayConfig(target, args.block_tokens, salt=args.salt)))
    except Exception as exc:  # noqa: BLE001 - only the gateway's failures are turned into a message
        if not unreachable(exc):
            raise
        raise SystemExit(f"kvmesh sim replay: {target.url}: {exc!r}") from None
    if speed_line:
        print(speed_line)
    summary = replay_summary(args.label, args.workers, trace, outcomes, args.slo_ttft_s, args.warmup_s)
    late = sorted(sent_late(trace, outcomes))
    print(f"# replay of {args.trace}: {len(trace)} requests at {mean_rate(trace):.2f} req/s against {target.url}; "
          f"goodput = requests/s with TTFT <= {args.slo_ttft_s} s; sent late by {late[len(late) // 2] * 1e3:.2f} ms "
          f"at the median, {late[-1] * 1e3:.2f} at most (TTFT counts from the send)")
    print(HEADER)
    print(row(summary, None))
    print(DETAIL_HEADER)
    print(detail_row(summary))
    return 0
