"""What a simulated worker's work costs, for cluster.py's event loop (the terms: meshcost.py): a
decode step now, a prefill's worker time beside the worker's running streams, the shared host's
slowdown, and each request's draw of the calibrated TTFT noise and hidden tokens (fixed by its id,
so every run of a trace draws alike)."""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable

from ..policy import CostModel
from ..registry import Role
from .decodectx import padded_tokens
from .meshcost import MeshCost
from .simworker import SimWorker
from .trace import TraceRequest


def step_s(cost: CostModel, mesh: MeshCost, d: SimWorker) -> float:
    """One engine step of d now: its running sequences and their context."""
    return mesh.step_s(cost, d.running, sum(d.contexts), padded_tokens(d.contexts))


def prefill_s(cost: CostModel, mesh: MeshCost, budget: int, d: SimWorker, tokens: int, cached: int,
              joining: bool = False) -> float:
    """A prefill of `tokens` new prompt tokens after `cached` ones on d, beside its running sequences,
    in steps of at most `budget` tokens; `joining` a step that prefills other prompts too: its own work
    only (the step's ride-along is paid)."""
    # NOTE: a fully cached prompt still takes one step: the engine computes its last token for the logits.
    chunks = max(1, -(-tokens // budget))
    beside = max(0, d.running - 1)
    cached_pair = mesh.attention_s_per_pair if mesh.attention_s_per_cached_pair is None else mesh.attention_s_per_cached_pair
    attention = mesh.attention_s_per_pair * tokens * tokens / 2 + cached_pair * tokens * cached
    own = (cost.prefill_s(tokens) + attention) * (1.0 + mesh.prefill_share * beside)
    if joining:
        return own
    return own + mesh.prefill_s_per_stream * beside + chunks * step_s(cost, mesh, d)


def host_slowdown(cost: CostModel, mesh: MeshCost, workers: Iterable[SimWorker], request_rate: float = 0.0) -> float:
    """How much slower a decode worker runs now on a shared host: the busy decode workers and the
    cores the mesh's own work takes (per request at `request_rate` a second, per step and per token
    of each busy worker at its step time, which slows with them) over host_parallelism, at least 1
    (meshcost.py); 1 when each worker has a host of its own."""
    if not mesh.host_parallelism:
        return 1.0
    busy = [w for w in workers if w.role is Role.DECODE and w.running]
    per_step = 0.0
    if mesh.host_cpu_s_per_step or mesh.host_cpu_s_per_token:  # NOTE: step_s per busy worker, on every event: only when charged
        per_step = sum(step_host_s(mesh, w.running) / step_s(cost, mesh, w) for w in busy)
    return shared_slowdown(mesh, len(busy), request_rate, per_step)


def shared_slowdown(mesh: MeshCost, busy: float, request_rate: float, steps_load: float) -> float:
    """host_slowdown's formula: `busy` busy decode workers, `request_rate` requests a second, and
    `steps_load` = Σ over the busy workers of step_host_s over its own (unslowed) step time."""
    if not mesh.host_parallelism:
        return 1.0
    base, p = busy + mesh.host_cpu_s_per_request * request_rate, mesh.host_parallelism
    return max(1.0, (base + math.sqrt(base * base + 4 * p * steps_load)) / (2 * p))


def measured_slowdown(mesh: MeshCost, busy: float, rows: float, request_rate: float, measured_step_s: float) -> float:
    """The slowdown behind a step that took `measured_step_s` on the shared host, with `busy` busy
    decode workers of `rows` rows each alike: host_slowdown solved from the slowed step (its A / s is
    busy × step_host_s(rows) / measured_step_s), so measured_step_s / it is the unslowed step that
    host_slowdown slows back to measured_step_s exactly (meshcal.fit unslows the ITL probe's steps so)."""
    if not mesh.host_parallelism:
        return 1.0
    base = busy + mesh.host_cpu_s_per_request * request_rate + busy * step_host_s(mesh, rows) / measured_step_s
    return max(1.0, base / mesh.host_parallelism)


def step_host_s(mesh: MeshCost, rows: float) -> float:
    """The host CPU outside the engine one engine step of a busy worker of `rows` rows costs: its
    per-step work and a message per stream_interval tokens of each row."""
    return mesh.host_cpu_s_per_step + mesh.host_cpu_s_per_token * rows / stream_interval(mesh, rows)


def stream_interval(mesh: MeshCost, rows: float) -> int:
    """Tokens per message of a worker running `rows` sequences (its stream_interval from
    stream_interval_from rows on, else 1; decode/stream.py)."""
    return max(1, mesh.stream_interval) if rows >= mesh.stream_interval_from else 1


def noise_factor(mesh: MeshCost, request_id: str) -> float:
    """This request's factor on its latency to first token: one of mesh.noise, by request id."""
    return mesh.noise[zlib.crc32(request_id.encode()) % len(mesh.noise)] if mesh.noise else 1.0


def hidden_count(mesh: MeshCost, request_id: str) -> int:
    """How many tokens this request streams before its first visible text: one of mesh.hidden_tokens,
    by request id (hashed apart from its noise factor's draw)."""
    counts = mesh.hidden_tokens
    return counts[zlib.crc32(b"hidden/" + request_id.encode()) % len(counts)] if counts else 0


def context_tokens(r: TraceRequest) -> float:
    """A running sequence's context for its decode steps: its prompt and half its output."""
    return r.prompt_tokens + r.output_tokens / 2
