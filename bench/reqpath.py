"""Where a request's time to first token goes on a real mesh: the client, the gateway, the scheduler
hop, the worker, and back, per request, at several loads of the simulator's fidelity trace.

    nice -n -10 .venv/bin/python bench/reqpath.py [--rates 8,22] [--decode 1] [--duration-s 25] [--rounds 2]

Starts `kvmesh up --decode N --prefill 0` (tiny; `--model DIR` for any), replays the fidelity
trace (bench/simfidelity.py's, prompts of token ids from its hash ids, a fresh salt each replay) at
each rate in turn, open loop, each request on its own connection as `kvmesh sim replay` sends it.
The client notes each request's wall-clock send and first chunk and the completion id in that
chunk; the mesh's span files (`<run dir>/traces`, read with `kvmesh trace`'s loader) give the rest,
joined by that id:

    A  client send -> the gateway's `gateway.request` span starts (the client's request work, the
       connection, the gateway's HTTP parse and middleware);
    B  -> its `routed` event (body, prompt checks and block hashes, the Routes stream's round trip
       to the scheduler and its policy);
    C  -> the worker's `decode.generate` span starts (the gateway's Generate frame to the worker);
    D  -> the worker's first token (the span's `ttft_s`), in three parts: D1 the worker's own work
       around the engine (its KV lookup, the hop to the engine process and back), D2 the wait in
       the engine (`engine_queue_s`), D3 the prefill step (`engine_prefill_s`);
    E  -> the client's first chunk (the frame back, the gateway's SSE, the client's read, and any
       tokens whose text was held back before it: those are decode steps).

Prints mean / median ms of each, and their sum (the client's TTFT), per rate and round, requests
sent in the first `--warmup-s` seconds left out; then the same means over the slowest tenth of the
requests (by the client's TTFT) and over the rest, so a tail shows which segment it sits in. The simulator's cost model (meshcost.py) takes
A + B + C + E at idle as `request_overhead_s`; how they grow with load is what this shows.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from kvmesh.runtime.launcher import MeshOptions, free_port
from kvmesh.runtime.supervisor import Mesh
from kvmesh.runtime.tracecli import Span, load_spans
from kvmesh.scheduler.sim.client import Target, new_client, sse_lines
from kvmesh.scheduler.sim.replay import prompt_token_ids
from kvmesh.scheduler.sim.trace import TraceRequest, synthetic
from simfidelity import trace_config  # the fidelity trace

SEGMENTS = ("A client -> gateway", "B -> routed", "C -> worker", "D1 worker", "D2 engine queue", "D3 prefill",
            "E -> client first chunk", "client TTFT")


@dataclass(slots=True)
class Sent:
    """One request as the client saw it: wall-clock ns, and the completion id of its first chunk."""

    arrival_s: float
    sent_ns: int = 0
    first_ns: int = 0
    completion_id: str = ""


@dataclass(slots=True)
class Spans:
    """One request's spans, by the request id the gateway gave it (the completion id)."""

    gateway: Span | None = None
    worker: Span | None = None


def read_spans(spans: Iterable[Span]) -> dict[str, Spans]:
    """The `gateway.request` and `decode.generate` spans, by request id (a migrated request's last
    worker span wins)."""
    out: dict[str, Spans] = {}
    for span in spans:
        if span.name == "gateway.request":
            out.setdefault(span.attributes.get("kvmesh.request_id", ""), Spans()).gateway = span
        elif span.name == "decode.generate":
            out.setdefault(span.attributes.get("request_id", ""), Spans()).worker = span
    return out


def segments_ms(sent: Sent, spans: Spans) -> tuple[float, ...] | None:
    """A..E (D in its three parts) and the client's TTFT of one request, in ms (None when a span or
    its times are missing)."""
    g, w = spans.gateway, spans.worker
    if g is None or w is None or not sent.first_ns or "ttft_s" not in w.attributes:
        return None
    routed = [t for name, t in g.events if name == "routed"]
    if not routed:
        return None
    worker_first = w.start_ns + w.attributes["ttft_s"] * 1e9
    marks = (sent.sent_ns, g.start_ns, routed[-1], w.start_ns, worker_first, sent.first_ns)
    a, b, c, d, e = ((y - x) / 1e6 for x, y in zip(marks, marks[1:]))
    queue_ms = 1e3 * float(w.attributes.get("engine_queue_s", 0.0))
    prefill_ms = 1e3 * float(w.attributes.get("engine_prefill_s", 0.0))
    return (a, b, c, d - queue_ms - prefill_ms, queue_ms, prefill_ms, e, (sent.first_ns - sent.sent_ns) / 1e6)


def summary(rows: list[tuple[float, ...]]) -> list[str]:
    """'mean / median' of each segment over `rows`."""
    return [f"{statistics.fmean(c):.1f} / {statistics.median(c):.1f}" for c in zip(*rows)] if rows else ["-"] * len(SEGMENTS)


def tail_split(rows: list[tuple[float, ...]], share: float = 0.1) -> tuple[list[tuple[float, ...]], list[tuple[float, ...]]]:
    """The slowest `share` of `rows` by the client's TTFT (their last field), and the rest."""
    ranked = sorted(rows, key=lambda r: r[-1])
    cut = len(ranked) - max(1, round(share * len(ranked))) if ranked else 0
    return ranked[cut:], ranked[:cut]


def means(rows: list[tuple[float, ...]]) -> list[str]:
    return [f"{statistics.fmean(c):.1f}" for c in zip(*rows)] if rows else ["-"] * len(SEGMENTS)


async def send(client, url: str, model: str, prompt: list[int], max_tokens: int, sent: Sent) -> None:  # noqa: ANN001
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "stream": True, "ignore_eos": True}
    sent.sent_ns = time.time_ns()
    async with client.stream("POST", f"{url}/v1/completions", content=json.dumps(body).encode(),
                             headers={"Content-Type": "application/json"}) as response:
        async for line in sse_lines(response.aiter_bytes()):
            if line.startswith("data: {") and not sent.first_ns:
                sent.first_ns = time.time_ns()
                sent.completion_id = json.loads(line[6:]).get("id", "")
            if line == "data: [DONE]":
                break


async def replay(url: str, model: str, trace: list[TraceRequest]) -> list[Sent]:
    salt = os.urandom(8).hex()
    prompts = [prompt_token_ids(r, salt=salt) for r in trace]
    out = [Sent(r.arrival_s) for r in trace]
    async with new_client(Target(url)) as client:
        t0 = time.perf_counter() + 0.5

        async def one(r: TraceRequest, prompt: list[int], sent: Sent) -> None:
            await asyncio.sleep(max(0.0, t0 + r.arrival_s - time.perf_counter()))
            try:
                await send(client, url, model, prompt, r.output_tokens, sent)
            except Exception as exc:  # noqa: BLE001 - a failed request is counted out, not fatal
                print(f"# request at {r.arrival_s:.2f} s failed: {exc!r}", file=sys.stderr)

        await asyncio.gather(*(one(r, p, s) for r, p, s in zip(trace, prompts, out, strict=True)))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rates", default="8,22", help="req/s of the trace, comma-separated")
    p.add_argument("--decode", type=int, default=1)
    p.add_argument("--duration-s", type=float, default=25.0)
    p.add_argument("--warmup-s", type=float, default=4.0)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--model", default="tiny")
    args = p.parse_args()
    rates = [float(r) for r in args.rates.split(",")]
    run_dir = tempfile.mkdtemp(prefix="kvmesh-reqpath-")
    mesh = Mesh(MeshOptions(model=args.model, port=free_port(), run_dir=run_dir, prefill=0, decode=args.decode,
                            policy="kv_aware"))
    mesh.start(timeout_s=240)
    try:
        print(f"kvmesh up --decode {args.decode} --prefill 0 (model {args.model}); ms, mean / median per request; "
              f"load average {os.getloadavg()[0]:.1f}")
        print("| round | req/s | requests | " + " | ".join(SEGMENTS) + " |")
        print("|---" * (len(SEGMENTS) + 3) + "|")
        served = mesh.gateway_url
        tails: list[tuple[int, float, list[tuple[float, ...]], list[tuple[float, ...]]]] = []
        for round_ in range(1, args.rounds + 1):
            for rate in rates:
                sents = asyncio.run(replay(served, args.model, synthetic(trace_config(args), rate)))
                time.sleep(1.5)  # the span files are flushed in batches
                spans = read_spans(load_spans(Path(run_dir) / "traces")[0])
                rows = [s for s in (segments_ms(x, spans.get(x.completion_id, Spans())) for x in sents
                                    if x.arrival_s >= args.warmup_s) if s is not None]
                print(f"| {round_} | {rate:g} | {len(rows)} | " + " | ".join(summary(rows)) + " |", flush=True)
                tails.append((round_, rate, *tail_split(rows)))
        print("\nmeans (ms) of the slowest tenth by the client's TTFT, and of the rest")
        print("| round | req/s | which | requests | " + " | ".join(SEGMENTS) + " |")
        print("|---" * (len(SEGMENTS) + 4) + "|")
        for round_, rate, tail, rest in tails:
            for which, rows in (("slowest 10%", tail), ("rest", rest)):
                print(f"| {round_} | {rate:g} | {which} | {len(rows)} | " + " | ".join(means(rows)) + " |")
    finally:
        mesh.stop()


if __name__ == "__main__":
    main()
