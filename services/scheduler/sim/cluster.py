"""Event-driven simulation of a mesh: the real Router (registry, index, policy, P/D, sticky)
over simulated workers that have a prefix cache, a prefill queue and a continuous decode batch.

Worker model (times from the CostModel, see bench/sim_calibration.md):
- each worker runs one prefill step at a time, FCFS; a prefill of n uncached tokens takes
  n × prefill_s_per_token plus one decode step (step_s(running)) per chunk of
  max_num_batched_tokens, since the running batch rides along with every chunk; prompts that
  arrive while a step runs wait for it and are prefilled together in the next one, up to
  max_num_batched_tokens (as the engine's scheduler admits every waiting prompt the step's token
  budget holds): the step's decode ride-along and its per-stream cost (MeshCost) are paid once,
  each prompt adds its own prefill work, and all of them get their first token at its end;
- up to max_num_seqs sequences run; more wait for a slot;
- after the first token a sequence decodes its other tokens at step_s(running) each;
- the cache is an LRU of kv_blocks blocks; prompt blocks enter it when prefilled, the whole turn
  (prompt + output) when it finishes; every change is a KV event the scheduler sees
  `event_delay_s` later; heartbeats every `heartbeat_interval_s`.
With prefill workers, the decode-first P/D decision may send the prompt to one; its KV then
reaches the decode worker after kv_transfer_s_per_token × tokens.

Mesh terms (MeshCost: per-request overhead and work, per-token overhead, the decode step's context
cost, CPU sharing, a prefill step at a token count its worker has not run lately (shapes.py), the
worker's pauses, a finished turn's KV hand-back, admission) are described in meshcost.py; all are
off by default. What a step and a prefill cost a worker, as pure functions: workertime.py.
With `routers` K > 1, K scheduler replicas (each its own Router: registry, index, sticky) take
arrivals in turn; replica j sees each KV event after event_delay_s × (1 + j / (K - 1)) (its own
lag, up to twice the first's), and its peers' routing decisions (load and predicted blocks) and
completions after peer_delay_s, as the replicas publish them over NATS when they happen
(docs/replicas.md); KV events come later because workers publish them after engine steps.
"""

from __future__ import annotations

import heapq
import itertools
import random
import zlib
from collections import deque
from dataclasses import dataclass, field, replace

from ..index import BlockIndex, EventBatch, Removed, Stored
from ..pd import PdConfig
from ..policy import CostModel, PolicyConfig, make_policy
from ..registry import HeartbeatInfo, Registry, Role
from ..router import RouteDecision, RouteQuery, Router, RouterConfig
from ..sticky import StickySessions
from .decodectx import padded_tokens
from .meshcost import HOST_LOAD_WINDOW_S, MeshCost
from .shapes import KERNEL_CACHE_COUNTS, ShapeCache
from .simworker import PrefillBatch, RequestResult, SimWorker
from .steps import StepFigures, tally_decode, tally_prefill, without_stalls
from .trace import TraceRequest
from .workertime import context_tokens, hidden_count, host_slowdown, noise_factor, prefill_s, step_s


@dataclass(frozen=True, slots=True)
class SimConfig:
    num_workers: int = 32
    num_prefill_workers: int = 0
    max_num_seqs: int = 64
    kv_blocks: int = 8192
    max_num_batched_tokens: int = 2048
    heartbeat_interval_s: float = 0.5
    event_delay_s: float = 0.05
    kv_transfer_s_per_token: float = 2.0e-6
    sticky_ttl_s: float = 0.0
    prediction_ttl_s: float = 2.0
    routers: int = 1                # scheduler replicas, each with its own view
    peer_delay_s: float = 0.005     # a replica's routing decision reaching its peers (one NATS hop)
    kernel_cache_counts: int = KERNEL_CACHE_COUNTS  # prefill step token counts a worker's CPU kernels stay cached for
    # each worker's kernel-count cache starts as a first pass of the same trace left it (a mesh in steady
    # state on this workload, shapes.py), not empty
    warm_kernel_caches: bool = True
    cost: CostModel = field(default_factory=CostModel)
    pd: PdConfig = field(default_factory=PdConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    mesh: MeshCost = field(default_factory=MeshCost)


class Cluster:
    """Replays a trace; `run(requests)` returns one RequestResult per request."""

    def __init__(self, policy_name: str, config: SimConfig) -> None:
        self.config = config
        self.policy_name = policy_name
        self.now = 0.0
        self.routers = [
            Router(Registry(heartbeat_timeout_s=3600.0, clock=lambda: self.now), BlockIndex(),
                   make_policy(policy_name, config.policy), StickySessions(config.sticky_ttl_s),
                   RouterConfig(config.cost, config.pd, config.prediction_ttl_s))
            for _ in range(max(1, config.routers))
        ]
        self.router = self.routers[0]
        self.registry = self.router.registry
        self._arrivals = 0
        workers = [(f"d{i:03d}", Role.DECODE) for i in range(config.num_workers)]
        workers += [(f"p{i:03d}", Role.PREFILL) for i in range(config.num_prefill_workers)]
        self.workers = {name: SimWorker(name, role, config.kv_blocks, config.max_num_seqs,
                                        shapes=ShapeCache(config.kernel_cache_counts)) for name, role in workers}
        self._events: list[tuple[float, int, str, object]] = []
        self._order = itertools.count()
        self.results: list[RequestResult] = []
        self.window_load: dict[str, float] = {}
        self.in_flight = 0
        self.gate_free_s = 0.0          # when the mesh-wide request server (request_busy_s) is free
        self.admission: deque[TraceRequest] = deque()
        self.stored: set[bytes] = set()  # blocks handed back to the KV store (MeshCost.handback_s)
        self._pending = 0
        self._recent: deque[float] = deque()  # arrival times within HOST_LOAD_WINDOW_S of now (host_slowdown)

    # --- event loop ---

    def _at(self, t: float, kind: str, payload: object = None) -> None:
        heapq.heappush(self._events, (t, next(self._order), kind, payload))

    def run(self, requests: list[TraceRequest], window: tuple[float, float] | None = None) -> list[RequestResult]:
        """Replays `requests` to the end; `window_load` gets each decode worker's ∫load dt over `window`."""
        if self.config.warm_kernel_caches and self.config.mesh.prefill_s_new_shape:
            first = Cluster(self.policy_name, replace(self.config, warm_kernel_caches=False))
            first.run(requests)
            for name, w in self.workers.items():
                w.shapes = first.workers[name].shapes
        for r in requests:
            self._at(r.arrival_s, "arrive", r)
        for t in window or ():
            self._at(t, "window")
        self._heartbeats()
        self._at(self.config.heartbeat_interval_s, "heartbeat")
        if self.config.mesh.pause_rate_hz and self.config.mesh.pause_s:
            for w in self.workers.values():
                self._next_pause(w, random.Random(zlib.crc32(w.worker_id.encode())))
        self._pending = len(requests)
        while self._events and self._pending:
            self.now, _, kind, payload = heapq.heappop(self._events)
            if kind == "arrive":
                self._recent.append(self.now)
            if kind == "arrive" and self.config.mesh.request_busy_s:
                self.gate_free_s = max(self.now, self.gate_free_s) + self.config.mesh.request_busy_s
                self._at(self.gate_free_s, "admit", payload)
            elif kind in ("arrive", "admit"):
                self._admit(payload)  # type: ignore[arg-type]
            elif kind == "first_token":
                self._first_token(*payload)  # type: ignore[misc]
            elif kind == "finish":
                self._finish(payload)  # type: ignore[arg-type]
            elif kind == "stall":
                payload[0].stall_s += payload[1]  # type: ignore[index]
            elif kind == "pause":
                self._pause(*payload)  # type: ignore[misc]
            elif kind == "deliver":
                j, batch = payload  # type: ignore[misc]
                self.routers[j].index.apply(batch)
            elif kind == "peer_route":
                j, decision, hashes = payload  # type: ignore[misc]
                prefill_id = None if decision.prefill is None else decision.prefill.worker_id
                self.routers[j].observe_peer_route(decision.decode.worker_id, prefill_id, hashes, decision.prefill_s)
            elif kind == "peer_complete":
                j, decode_id = payload  # type: ignore[misc]
                self.routers[j].registry.observe_peer_complete(decode_id)
            elif kind == "window":
                for w in self.workers.values():
                    w.mark_load(self.now)
                    self.window_load[w.worker_id] = w.load_area - self.window_load.get(w.worker_id, 0.0)
            elif kind == "heartbeat":
                self._heartbeats()
                self._at(self.now + self.config.heartbeat_interval_s, "heartbeat")
        for w in self.workers.values():
            self._mark(w)
        return self.results

    def _mark(self, d: SimWorker) -> None:
        """Brings d's load and step tallies up to now (before its running sequences change)."""
        d.mark_load(self.now)
        dt, d.tally_since = self.now - d.tally_since, self.now
        if d.running:
            d.running_s += dt
            tally_decode(d.steps, dt, self._host_step_s(d), d.running, padded_tokens(d.contexts))

    def step_figures(self) -> StepFigures:
        """What the decode workers' engine steps ran over the whole run, summed (steps.py)."""
        total = StepFigures()
        for w in self.workers.values():
            if w.role is Role.DECODE:
                total.add(without_stalls(w.steps, w.running_s, w.stall_s))
        return total

    def _heartbeats(self) -> None:
        for router in self.routers:
            for w in self.workers.values():
                router.observe_heartbeat(HeartbeatInfo(
                    worker_id=w.worker_id, role=w.role, endpoint=w.worker_id, num_running=w.running,
                    num_waiting=len(w.slot_queue), kv_blocks_total=w.kv_blocks, kv_blocks_free=w.kv_blocks - len(w.cache),
                    max_num_seqs=w.max_num_seqs,
                ))
            router.sweep()

    def _event_delay_s(self, j: int) -> float:
        k = len(self.routers)
        return self.config.event_delay_s * (1 + (j / (k - 1) if k > 1 else 0))

    def _publish(self, w: SimWorker, stored: list[bytes], removed: list[bytes]) -> None:
        if not stored and not removed:
            return
        w.seq += 1
        events = ((Stored(tuple(stored)),) if stored else ()) + ((Removed(tuple(removed)),) if removed else ())
        batch = EventBatch(w.worker_id, w.seq, events)
        for j in range(len(self.routers)):
            self._at(self.now + self._event_delay_s(j), "deliver", (j, batch))

    # --- request lifecycle ---

    def _admit(self, r: TraceRequest) -> None:
        mesh = self.config.mesh
        if not mesh.admission_limit or self.in_flight < mesh.admission_limit and not self.admission:
            self.in_flight += 1
            self._arrive(r)
        elif len(self.admission) >= mesh.admission_limit * mesh.admission_queue_factor:
            self._fail(r, 429)
        else:
            self.admission.append(r)

    def _admit_waiting(self) -> None:
        limit, timeout = self.config.mesh.admission_limit, self.config.mesh.admission_timeout_s
        while self.admission and (not limit or self.in_flight < limit):
            r = self.admission.popleft()
            if self.now - r.arrival_s > timeout:
                self._fail(r, 504)
            else:
                self.in_flight += 1
                self._arrive(r)

    def _fail(self, r: TraceRequest, status: int) -> None:
        self.results.append(RequestResult(r, "", status=status, first_token_s=self.now, finish_s=self.now))
        self._pending -= 1

    def _step_s(self, d: SimWorker) -> float:
        return step_s(self.config.cost, self.config.mesh, d)

    def _host_step_s(self, d: SimWorker) -> float:
        """d's decode step now, on its host as busy as it is now."""
        return self._step_s(d) * self._slowdown()

    def _prefill_s(self, d: SimWorker, tokens: int, cached: int, joining: bool = False) -> float:
        return prefill_s(self.config.cost, self.config.mesh, self.config.max_num_batched_tokens, d, tokens, cached, joining)

    def recent_rate(self, others: bool = False) -> float:
        """Requests a second that reached the mesh in the last HOST_LOAD_WINDOW_S (`others`: less the one now)."""
        while self._recent and self._recent[0] < self.now - HOST_LOAD_WINDOW_S:
            self._recent.popleft()
        return max(0, len(self._recent) - others) / HOST_LOAD_WINDOW_S

    def _slowdown(self) -> float:
        return host_slowdown(self.config.cost, self.config.mesh, self.workers.values(), self.recent_rate())

    def _arrive(self, r: TraceRequest) -> None:
        hashes = r.block_hashes()[: r.prompt_tokens // self.config.cost.block_size]
        j, self._arrivals = self._arrivals % len(self.routers), self._arrivals + 1
        router = self.routers[j]
        decision = router.route(RouteQuery(r.request_id, r.prompt_tokens, hashes, r.session_id, r.output_tokens))
        for peer in range(len(self.routers)):
            if peer != j:  # replicas share each decision's load and predicted blocks over NATS
                self._at(self.now + self.config.peer_delay_s, "peer_route", (peer, decision, hashes))
        d = self.workers[decision.decode.worker_id]
        self._mark(d)
        result = RequestResult(r, d.worker_id, hashes, router=j)
        if d.running < d.max_num_seqs:
            self._start(d, result, decision)
        else:
            d.slot_queue.append((result, decision))

    def _local_prefill(self, d: SimWorker, result: RequestResult, tokens: int, cached: int) -> tuple[float, float, float]:
        """Puts a local prefill in d's next prefill step: the one not yet begun, if its token budget
        holds these tokens too, else a new one after d's busy time. Returns (step start, step end, the
        latency it adds for starting a step beside running streams: MeshCost.prefill_s_beside)."""
        mesh, budget = self.config.mesh, self.config.max_num_batched_tokens
        extra = cached * mesh.hit_s_per_token
        batch = d.batch
        if batch is not None and batch.start_s > self.now and batch.tokens + tokens <= budget:
            shape = d.new_shape_s(batch, batch.tokens + tokens, mesh, budget)
            added = (self._prefill_s(d, tokens, cached, joining=True) + extra + shape) * self._slowdown()
            # NOTE: a hand-back or pause queued after the step moves with it
            d.busy_until = max(d.busy_until, batch.end_s) + added
            batch.end_s += added
            batch.tokens += tokens
            tally_prefill(d.steps, added, batch.rows, 0.0, new_step=False)
            latency = 0.0
            if self.config.mesh.prefill_stall:
                self._at(batch.start_s, "stall", (d, self.config.mesh.prefill_stall * added))
        else:
            start = max(self.now, d.busy_until)
            batch = d.batch = PrefillBatch(start, start, tokens, rows=max(0, d.running - 1))
            latency = mesh.prefill_s_beside if batch.rows else 0.0
            shape = d.new_shape_s(batch, tokens, mesh, budget)
            end = batch.end_s = start + (self._prefill_s(d, tokens, cached) + extra + shape) * self._slowdown()
            d.busy_until = end
            tally_prefill(d.steps, end - start, batch.rows, padded_tokens(d.contexts) if batch.rows else 0.0, new_step=True)
            if self.config.mesh.prefill_stall:
                self._at(start, "stall", (d, self.config.mesh.prefill_stall * (end - start)))
        result.batch, result.batch_mark = batch, batch.end_s
        return batch.start_s, batch.end_s, latency

    def _start(self, d: SimWorker, result: RequestResult, decision: RouteDecision) -> None:
        d.running += 1
        result.started_s = self.now
        bs = self.config.cost.block_size
        r, hashes = result.request, result.hashes
        d_cached = d.cached_prefix(hashes)
        noise = result.noise = noise_factor(self.config.mesh, r.request_id)
        result.pause_mark = d.paused_s
        if decision.prefill is None:
            result.cached_tokens = d_cached * bs
            start, end, latency = self._local_prefill(d, result, r.prompt_tokens - d_cached * bs, d_cached * bs)
        else:
            p = self.workers[decision.prefill.worker_id]
            cached = max(d_cached, p.cached_prefix(hashes))
            result.cached_tokens = cached * bs
            start = max(self.now, p.busy_until)
            tokens = r.prompt_tokens - cached * bs
            shape = p.new_shape_s(PrefillBatch(start, start, tokens), tokens, self.config.mesh,
                                  self.config.max_num_batched_tokens)
            p_end = start + self._prefill_s(p, tokens, cached * bs) + shape
            p.busy_until = p_end
            self._publish(p, *p.insert(hashes))  # NOTE: published early; the scheduler sees it after the delay anyway
            end = p_end + (r.prompt_tokens - d_cached * bs) * self.config.kv_transfer_s_per_token
            end += self._host_step_s(d)
            latency = 0.0
        # NOTE: the noise stretches this request's latency only, not the worker's busy time: the
        # probes measured it on lone requests, and a stretched prefill queued behind would count it twice.
        d.contexts.append(context_tokens(r))  # NOTE: after its prefill: that step's attention is the prefill's own
        overhead = self.config.mesh.request_overhead_s + self.config.mesh.request_s_per_rps * self.recent_rate(others=True)
        self._at(start + (end - start + overhead + latency) * noise, "first_token", (d, result))

    def _next_pause(self, w: SimWorker, rng: random.Random) -> None:
        self._at(self.now + rng.expovariate(self.config.mesh.pause_rate_hz), "pause", (w, rng))

    def _pause(self, w: SimWorker, rng: random.Random) -> None:
        """The worker stops everything for pause_s (MeshCost), if it has sequences (the probes measured
        the pauses' rate over time spent decoding): its prefills and the first tokens and decodes of its
        sequences all come that much later."""
        if w.running:
            pause = self.config.mesh.pause_s
            w.stall_s += pause
            w.paused_s += pause
            w.busy_until = max(w.busy_until, self.now) + pause
        self._next_pause(w, rng)

    def _first_token(self, d: SimWorker, result: RequestResult) -> None:
        batch = result.batch
        if batch is not None and batch.end_s > result.batch_mark:  # more prompts joined its prefill step since
            self._at(self.now + (batch.end_s - result.batch_mark) * result.noise, "first_token", (d, result))
            result.batch_mark = batch.end_s
            return
        if d.paused_s > result.pause_mark:  # the worker paused since this first token was scheduled
            self._at(self.now + d.paused_s - result.pause_mark, "first_token", (d, result))
            result.pause_mark = d.paused_s
            return
        result.first_token_s = self.now
        if batch is not None:  # what the engine's queue and prefill histograms see (a local prefill)
            result.queue_s, result.prefill_s = batch.start_s - result.started_s, batch.end_s - batch.start_s
        self._publish(d, *d.insert(result.hashes))
        step_s = self._host_step_s(d)
        decode_s = (result.request.output_tokens - 1) * step_s
        result.hidden_s = min(hidden_count(self.config.mesh, result.request.request_id), result.request.output_tokens - 1) * step_s
        result.stall_mark = d.stall_s
        self._at(self.now + decode_s, "finish", (d, result))

    def _finish(self, payload: tuple[SimWorker, RequestResult]) -> None:
        d, result = payload
        if d.stall_s > result.stall_mark:  # local prefills ran meanwhile: the decode stalled that long
            self._at(self.now + d.stall_s - result.stall_mark, "finish", payload)
            result.stall_mark = d.stall_s
            return
        r = result.request
        result.finish_s = self.now
        self.results.append(result)
        output = tuple(h.to_bytes(8, "little") for h in r.output_hash_ids)
        self._publish(d, *d.insert(result.hashes + output))
        # NOTE: only the blocks the store lacks are copied and put (decode/handback.py); the lookup is per turn
        fresh = [h for h in result.hashes + output if h not in self.stored]
        self.stored.update(fresh)
        handback = self.config.mesh.handback_s(len(fresh) * self.config.cost.block_size)
        if handback:  # NOTE: the turn's KV goes to the store: the worker's queued prefills wait, its streams stop
            d.busy_until = max(d.busy_until, self.now) + handback
            self._at(self.now, "stall", (d, handback))
        self._mark(d)
        d.running -= 1
        d.contexts.remove(context_tokens(r))
        self.routers[result.router].complete(r.request_id)
        for peer in range(len(self.routers)):
            if peer != result.router:
                self._at(self.now + self.config.peer_delay_s, "peer_complete", (peer, d.worker_id))
        self._pending -= 1
        if d.slot_queue:
            nxt, decision = d.slot_queue.popleft()
            self._start(d, nxt, decision)
        self.in_flight -= 1
        self._admit_waiting()
