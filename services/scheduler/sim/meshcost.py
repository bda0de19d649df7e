"""Costs of the mesh around the engine, for the simulator (cluster.py); measured end to end by
`kvmesh sim calibrate` (meshcal.py). All are off by default: zeros model the engine alone.

- attention_s_per_pair: the quadratic part of a prefill: each new prompt token attends to every
  token before it, so n new tokens after c cached ones cost attention_s_per_pair × n²/2 +
  attention_s_per_cached_pair × n × c on top of the linear n × prefill_s_per_token (on a small
  model this term dominates long prompts); the cached pairs cost what the new ones do unless set
  (measured on the tiny model on CPU: ~0.3-0.5x, since the n²/2 term of an uncached prompt also
  holds work that grows with its square beside the attention itself);
- request_overhead_s is added to every TTFT (HTTP, tokenizing, routing, gRPC set-up);
- request_s_per_rps: and this much more per request a second that reached the mesh in the last
  HOST_LOAD_WINDOW_S before it (itself not counted), as latency only: the request's path outside
  the engine (the client, the gateway, the Routes stream's round trip, the Generate frame, the
  first chunk back) slows with the mesh's traffic. Why: bench/reqpath.py on a 1-worker mesh under
  the fidelity trace, medians of that path (client send -> gateway span -> routed -> worker span;
  worker first token -> client first chunk): 9.8 ms at 8 req/s, 12.6-20 at 22 req/s, against ~7.4
  for a lone probe request; the probes that set the other terms send one request, or one prefill
  beside steady streams, at a time. `kvmesh sim calibrate` fits it on the path-load probe
  (pathload.py): requests like a trace's later turn at Poisson arrivals whose rate steps between
  three levels, each level's median TTFT against what the sim says for the same requests. NOTE: the
  term is linear in the rate; the probe's levels read convex (on run BD's other terms, 18.1, 20.2,
  22.8 ms at 11, 14 and 21 req/s against lone requests' 18.1: flat, then ~0.5 ms per req/s), so a
  line through the origin fits it low (0.08 ms per req/s there);
- request_busy_s: the CPU work of a request outside the engine that requests queue for, mesh-wide
  (gateway, scheduler, RPC set-up, hand-back): every request passes one FIFO server of this
  service time before admission, so it bounds the mesh's request rate whatever its worker count;
- prefill_share, prefill_s_per_stream, prefill_s_beside: a prefill beside k ≥ 1 other running
  streams takes (1 + prefill_share × k) times as long, plus prefill_s_per_stream × k, as worker
  time, since the worker's RPC loop (and the gateway) work for those streams on the same CPU; and
  the request that starts such a step gets its first token prefill_s_beside later, as latency only
  (a worker that is decoding is mid-step when the request reaches it and shares the GIL with its
  engine thread). Latency, not worker time: the engine's own prefill steps under the fidelity
  trace (the decode worker's step counters, steps.py) took 0.095 and 0.16 of its time at 50% and
  80% load, which the sim gives without it as worker time (0.10, 0.16) and not with it (0.13,
  0.27, its queue running away: 7.5 decode rows a step against the mesh's 3.5). `kvmesh sim calibrate` measures them beside 2-32 streams, at two prompt
  lengths (the first term grows with the prefill, the others do not; the once-off one is what a
  line through the stream counts leaves at one stream). Why the once-off term: on a 1-worker mesh a
  904-token prompt (704 cached) took 20.8 ms alone and 26.8, 28.2, 25.1, 28.8 beside 1, 2, 4, 8
  streams; the trace's requests, beside 1-3 streams, took 6-15 ms more than a sim without it said;
- prefill_s_new_shape: a prefill step whose token count (its prompts' uncached tokens plus its decode
  rows) is not among the last SimConfig.kernel_cache_counts distinct counts its worker ran takes this much
  longer, as worker time (its queued prefills wait, its streams stall as for the rest of the step):
  the engine's CPU kernels are built per shape and cached (shapes.py); `kvmesh sim calibrate`
  measures it as a lone request at a token count just run against one at a count never sent;
- hidden_tokens: a request's client sees its first token only when it has text; one of these counts
  per request (by its id) is how many tokens it streams before that, and its TTFT as a client sees
  it (what the sim reports) is that many of its worker's decode steps after its first token. The
  gateway sends no chunk for a token whose text is held back (a byte of an unfinished UTF-8
  character, a skipped special token): the tiny model's random bytes hid 0 tokens in about half of
  its requests and 1-4 in the rest, so under load, where a step takes longer, its client-side TTFT
  grew by several decode steps that the engine and the gateway's histogram do not see (run AM:
  client mean 74-95 ms against the gateway's 49-58 at 50% load; 37-40 against 31-33 at 10%);
- token_overhead_s is added to a decode step per running sequence (per-token RPC/SSE work);
- decode_s_per_context_token is added to a decode step per token of context of each running
  sequence (its attention over its KV; a sequence counts prompt + output / 2): the old, linear
  model, which `kvmesh sim calibrate` no longer fits;
- decode_s_per_kv_token, decode_s_per_padded_token, decode_padded_knee_tokens: a decode step takes
  decode_s_per_kv_token × padded + decode_s_per_padded_token × max(0, padded − knee) longer, padded =
  running sequences × the longest one's context, since the engine's attention pads every row to the
  longest, and it costs more per token once that outgrows the CPU's cache (decodectx.py has the
  measurement); what `kvmesh sim calibrate` fits;
- handback_s_per_turn, handback_s_per_token: when a turn ends its decode worker hands its KV back
  to the store, which holds the worker busy for per_turn + per_token × the turn's tokens (its queued
  prefills wait, its running streams stop; handback.py has the measurement);
- hit_s_per_token: what a prompt token found in the worker's prefix cache still costs;
- prefill_stall: while a decode worker prefills locally, its running sequences stop decoding for
  this fraction of the prefill (1 = the engine and its RPC loop share one CPU, nothing overlaps);
- pause_rate_hz, pause_s: a worker stops all its work (prefill, decode, every stream at once) for
  pause_s, pause_rate_hz times a second while it has sequences (a Poisson process, seeded by the
  worker's id): the mesh's correlated stalls, which the ITL probe's token times show as gaps that
  most streams of a run share (meshstreams.correlated_pauses), at 0.4-2.3 a second of ~50 ms;
- noise: factors on a request's latency from the start of its prefill to its first token (not on
  the worker's busy time), one per request drawn uniformly by its id (deterministic): deciles of
  the path-load probe's TTFTs over the sim's for the same requests (pathload.residual_noise; without
  that probe, of prefills beside decoding streams over their probe point's median, or of lone TTFTs:
  meshcal.ttft_noise), i.e. the spread a loaded host adds (bursts of other requests' work, other work
  on a shared machine), which a deterministic model has no tail for;
- host_parallelism: every decode worker runs on one host (as `kvmesh up` does) that runs this many
  busy workers at full speed (its cores left over by the gateway, scheduler and client): with b
  busy workers (any running sequence) a worker's prefill and decode steps take max(1, b / this)
  times as long, taken when the work is scheduled; 0 = each worker has a host of its own. With one
  decode worker `kvmesh sim calibrate` sets 1 when its engine runs on the calibrating host: the engine's
  torch threads are one per core (the default) and a step waits for the slowest, so the mesh's other
  work (below) slows it. Why: on a 1-worker mesh under the path-load probe's requests at 18-24 req/s
  the mesh outside the engine took 0.76-0.86 of the 2 cores and the engine got 0.73-0.75, and run BG's
  replays' decode steps took 1.1-1.7x the sim's at their rows; on BG's probes
  with 1 and the host-load terms measured on one worker (4.8 ms a request, 1.06 ms a step, 69 µs a
  token) the sim's capacity went 28 → 21 req/s against a real 22.75, and its TTFTs at 11.4 and 18.2
  req/s (50% and 80% load) rose to within 11% (p50) and 18% (p90) of the real ones, from -11..-20% / -27..-42%;
- host_cpu_s_per_request, host_cpu_s_per_step, host_cpu_s_per_token: the host CPU the mesh spends
  outside the engines (the gateway, the scheduler, the workers' RPC loops, the KV store, a client on
  the same host) per request, per engine step of a busy decode worker (its step frame, the RPC loop's
  and the gateway's wake-ups) and per streamed token, which takes from the cores the busy workers
  share: with r requests in the last HOST_LOAD_WINDOW_S a second and A = Σ over busy workers of
  (per_step + per_token × its rows / its interval) / its own step time, the slowdown s above solves
  s = max(1, (b + per_request × r + A / s) / host_parallelism) (the mesh's per-step work slows with the
  steps it serves), i.e. s = ((b + R) + √((b + R)² + 4 P A)) / 2P, R = per_request × r. Why: on 2 cores at
  9 req/s of the fidelity trace, with 2 decode workers, everything but the two engines took 0.53 of a
  core (the workers' RPC loops 0.18, the gateway 0.14, the replay client 0.13, the KV store 0.04, the
  scheduler 0.03), which the host-sharing probe (lone prefills, no other traffic) does not see.
  NOTE: with one worker per_request is the host-load probe's (32-token prompts), well below what a
  trace's request costs the host (the path-load probe's runs: 48 ms a request beyond the steps and
  tokens, run BI); charged at that, the sim's 1-worker steps ran ~1.9x the real ones at 80% load,
  since the mesh's work outside the engine runs partly while the engine waits, and one worker's
  host_parallelism of 1 takes it all from the engine's core (meshcal.fit_path_load; that run's fit
  still charged these terms twice, below). With several workers it is the path-load probe's (16-18 ms
  a request in runs BZ and CA; pathcpu.py): they share every core;
  the probes' own timings hold this work, so `kvmesh sim calibrate` takes the slowdown it causes in
  each probe's state out of them (meshcal.py), and the sim puts it back: at the probes' loads it
  gives their timings back, and above them it grows with the requests, steps and tokens;
- stream_interval, stream_interval_from: the decode workers' token coalescing (decode/config.py):
  with at least `stream_interval_from` rows a worker sends a request's tokens `stream_interval` at a
  time, so the per-token host cost above (fitted on fewer streams, a message and an SSE chunk per
  token) is charged once per `stream_interval` tokens there. Why: that is what the worker sends
  (bench/tokcost.py at 32 streams: 0.25 SSE chunks a token at an interval of 4, 0.14 at 8); it moved
  none of run BA's figures, whose loads keep 2-3 rows a worker. The workers' time bound
  (`stream_interval_ms`, 20 ms) is not modelled: on this host's steps (2-4 ms at 32-64 rows) the
  interval's steps end first or nearly so;
- admission_limit: at most this many requests in flight mesh-wide, the rest wait (FIFO) before
  routing; one that waits longer than admission_timeout_s fails with 504, one that finds
  admission_limit × admission_queue_factor already waiting fails with 429 (the scheduler's
  admission queue and the gateway's route deadline).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..policy import CostModel
from .decodectx import hinge_s
from .handback import handback_s

HOST_LOAD_WINDOW_S = 1.0  # the recent past whose arrivals set the mesh's own load on a shared host


@dataclass(frozen=True, slots=True)
class MeshCost:
    """Costs of the mesh around the engine (see the module docstring); zeros = the engine alone."""

    attention_s_per_pair: float = 0.0
    attention_s_per_cached_pair: float | None = None
    request_overhead_s: float = 0.0
    request_s_per_rps: float = 0.0
    request_busy_s: float = 0.0
    token_overhead_s: float = 0.0
    decode_s_per_context_token: float = 0.0
    decode_s_per_kv_token: float = 0.0
    decode_s_per_padded_token: float = 0.0
    decode_padded_knee_tokens: float = 0.0
    hit_s_per_token: float = 0.0
    handback_s_per_turn: float = 0.0
    handback_s_per_token: float = 0.0
    prefill_stall: float = 0.0
    prefill_share: float = 0.0
    prefill_s_per_stream: float = 0.0
    prefill_s_beside: float = 0.0
    prefill_s_new_shape: float = 0.0
    host_parallelism: float = 0.0
    host_cpu_s_per_request: float = 0.0
    host_cpu_s_per_step: float = 0.0
    host_cpu_s_per_token: float = 0.0
    stream_interval: int = 8  # NOTE: the decode worker's defaults (decode/config.py; a test keeps them equal)
    stream_interval_from: int = 16
    noise: tuple[float, ...] = ()
    hidden_tokens: tuple[int, ...] = ()
    pause_rate_hz: float = 0.0
    pause_s: float = 0.0
    admission_limit: int = 0
    admission_timeout_s: float = 30.0
    admission_queue_factor: float = 1.0

    def step_s(self, cost: CostModel, rows: float, context_tokens: float, padded: float) -> float:
        """One decode step of `rows` sequences with `context_tokens` tokens of context in all, `padded` KV
        tokens read: the engine's step (`cost`), the per-token overhead and the context cost."""
        return cost.step_s(rows) + self.token_overhead_s * rows + self.context_s(context_tokens, padded)

    def context_s(self, context_tokens: float, padded: float) -> float:
        """A decode step's context cost for `context_tokens` tokens of context in all, `padded` KV tokens read."""
        return (self.decode_s_per_context_token * context_tokens
                + hinge_s(padded, self.decode_s_per_padded_token, self.decode_padded_knee_tokens, self.decode_s_per_kv_token))

    def handback_s(self, tokens: float) -> float:
        """The worker time handing back a finished turn of `tokens` tokens takes (handback.py)."""
        return handback_s(tokens, self.handback_s_per_turn, self.handback_s_per_token)
