"""Traces for the simulator: synthetic multi-turn sessions, and a JSONL file format.

A request carries the ids of its prompt's full blocks (`hash_ids`), chained in the sense that two
prompts share block i only if they share every token up to the end of block i. Synthetic
sessions start with one of a few shared system prompts (Zipf-skewed popularity); each turn's
prompt is the whole conversation so far plus a new user message, so it extends the previous
turn's prompt and output. The file format is one JSON object per line:

    {"t": 0.25, "session_id": "s1", "prompt_tokens": 1100, "output_tokens": 120, "hash_ids": [3, 9, ...],
     "output_hash_ids": [41, ...]}

(`output_hash_ids`, optional, names the full blocks the turn's output completes, so the next turn
can hit them.)
Mooncake-style rows (`timestamp` in ms, `input_length`, `output_length`, `hash_ids`) are read too.
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

_SESSION_BIT = 1 << 62


@dataclass(frozen=True, slots=True)
class TraceRequest:
    arrival_s: float
    request_id: str
    session_id: str
    prompt_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...]
    output_hash_ids: tuple[int, ...] = ()   # full blocks the turn adds past its prompt's (known to the trace)

    def block_hashes(self) -> tuple[bytes, ...]:
        return tuple(h.to_bytes(8, "little") for h in self.hash_ids)

    def turn_block_hashes(self) -> tuple[bytes, ...]:
        """Prompt blocks then output blocks: what the decode worker holds when the turn ends."""
        return self.block_hashes() + tuple(h.to_bytes(8, "little") for h in self.output_hash_ids)


@dataclass(frozen=True, slots=True)
class SyntheticConfig:
    duration_s: float = 30.0                  # sessions start during [0, duration_s)
    num_system_prompts: int = 8
    system_prompt_tokens: tuple[int, int] = (768, 2048)
    skew: float = 1.0                         # Zipf exponent of system-prompt popularity
    turns_mean: float = 4.0                   # geometric number of turns per session
    user_tokens: tuple[int, int] = (32, 384)
    output_tokens: tuple[int, int] = (32, 256)
    think_time_s: float = 2.0                 # mean gap between a turn's arrival and the next
    arrival: str = "poisson"                  # "poisson" | "bursty"
    burstiness: float = 4.0                   # bursty: squared coefficient of variation of gaps
    max_prompt_tokens: int = 8192
    block_size: int = 16
    seed: int = 0


def _session_starts(config: SyntheticConfig, session_rate: float, rng: random.Random) -> list[float]:
    """Session start times: Poisson, or bursty (gamma gaps with CV² = burstiness)."""
    if config.arrival not in ("poisson", "bursty"):
        raise ValueError(f"unknown arrival process {config.arrival!r}: expected poisson or bursty")
    shape = 1.0 / config.burstiness if config.arrival == "bursty" else 1.0
    t, starts = 0.0, []
    while True:
        t += rng.gammavariate(shape, 1.0 / (shape * session_rate))
        if t >= config.duration_s:
            return starts
        starts.append(t)


def synthetic(config: SyntheticConfig, rate: float) -> list[TraceRequest]:
    """Multi-turn sessions starting over `duration_s`, about `rate` requests/s once warmed up
    (session rate = rate / turns_mean). Session k has the same content whatever the rate."""
    if rate <= 0:
        raise ValueError("rate must be > 0")
    bs = config.block_size
    layout = random.Random(config.seed)
    weights = [1.0 / (k + 1) ** config.skew for k in range(config.num_system_prompts)]
    system_lengths = [layout.randint(*config.system_prompt_tokens) for _ in range(config.num_system_prompts)]
    starts = _session_starts(config, rate / config.turns_mean, random.Random(config.seed + 1))
    requests = []
    for s, start in enumerate(starts):
        rng = random.Random(config.seed * 1_000_003 + s)
        system = rng.choices(range(config.num_system_prompts), weights)[0]
        system_len = system_lengths[system]
        history, t, turn = system_len, start, 0
        while True:
            prompt = history + rng.randint(*config.user_tokens)
            output = rng.randint(*config.output_tokens)
            if prompt + output > config.max_prompt_tokens:
                break
            ids = tuple(
                (system << 32 | i) if (i + 1) * bs <= system_len else (_SESSION_BIT | s << 24 | i) for i in range(prompt // bs)
            )
            out_ids = tuple(_SESSION_BIT | s << 24 | i for i in range(prompt // bs, (prompt + output) // bs))
            requests.append(TraceRequest(t, f"s{s}-t{turn}", f"s{s}", prompt, output, ids, out_ids))
            history, turn = prompt + output, turn + 1
            if rng.random() < 1.0 / config.turns_mean:
                break
            t += rng.expovariate(1.0 / config.think_time_s)
    requests.sort(key=lambda r: r.arrival_s)
    return requests


def scale_rate(requests: list[TraceRequest], factor: float) -> list[TraceRequest]:
    """The same trace with arrival times divided by `factor` (factor 2 = twice the rate)."""
    return [
        TraceRequest(r.arrival_s / factor, r.request_id, r.session_id, r.prompt_tokens, r.output_tokens, r.hash_ids, r.output_hash_ids)
        for r in requests
    ]


def without_output_blocks(requests: Iterable[TraceRequest]) -> list[TraceRequest]:
    """The same trace with no output_hash_ids: what a replay on a real mesh can reproduce, since
    the model writes its own output (replay.py)."""
    return [dataclasses.replace(r, output_hash_ids=()) for r in requests]


def mean_rate(requests: list[TraceRequest]) -> float:
    if len(requests) < 2:
        return 0.0
    span = requests[-1].arrival_s - requests[0].arrival_s
    return (len(requests) - 1) / span if span > 0 else 0.0


def write_jsonl(requests: Iterable[TraceRequest], path: Path) -> None:
    with Path(path).open("w", encoding="utf-8") as f:
        for r in requests:
            row = {"t": round(r.arrival_s, 6), "request_id": r.request_id, "session_id": r.session_id,
                   "prompt_tokens": r.prompt_tokens, "output_tokens": r.output_tokens, "hash_ids": list(r.hash_ids)}
            if r.output_hash_ids:
                row["output_hash_ids"] = list(r.output_hash_ids)
            f.write(json.dumps(row, separators=(",", ":")) + "\n")


def read_jsonl(path: Path) -> list[TraceRequest]:
    """Reads our rows or Mooncake-style rows; raises ValueError naming the bad line."""
    requests = []
    with Path(path).open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                t = float(row["t"]) if "t" in row else float(row["timestamp"]) / 1000.0
                prompt = int(row.get("prompt_tokens", row.get("input_length", 0)))
                output = int(row.get("output_tokens", row.get("output_length", 0)))
                ids = tuple(int(h) for h in row.get("hash_ids", ()))
                out_ids = tuple(int(h) for h in row.get("output_hash_ids", ()))
                request_id = str(row.get("request_id", f"r{n}"))
                session = str(row.get("session_id", ""))
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"{path}:{n}: bad trace row ({exc})") from None
            if prompt < 1 or output < 1 or any(h < 0 or h >= 1 << 64 for h in ids + out_ids):
                raise ValueError(f"{path}:{n}: prompt/output tokens must be >= 1 and hash ids 64-bit unsigned")
            requests.append(TraceRequest(t, request_id, session, prompt, output, ids, out_ids))
    requests.sort(key=lambda r: r.arrival_s)
    return requests
