"""The scheduler's core: registry + block index + policy + P/D decision + sticky sessions.

Pure and synchronous. The gRPC/NATS shell and the simulator both drive this one class.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from .index import BlockIndex
from .pd import PdConfig, PdDecision, decide
from .policy import CostModel, Policy, RequestView, RoutingState, WorkerView
from .prewarm import Prewarmer
from .registry import Assignment, HeartbeatInfo, Registry, Role, Seen, Worker
from .sticky import StickySessions, overloaded

MAX_HASH_BYTES = 64


class NoWorkerAvailable(Exception):
    """No decode worker can take the request (the service answers UNAVAILABLE)."""


@dataclass(frozen=True, slots=True)
class RouteQuery:
    request_id: str
    num_prompt_tokens: int
    block_hashes: tuple[bytes, ...] = ()
    session_id: str = ""
    max_tokens: int = 0
    pool: str = ""
    exclude: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Target:
    worker_id: str
    endpoint: str


@dataclass(frozen=True, slots=True)
class RouteDecision:
    request_id: str
    decode: Target
    prefill: Target | None          # None = local prefill on the decode worker
    decode_cached_blocks: int
    prefill_cached_blocks: int
    policy: str
    pool: str
    sticky: bool = False
    pd_reason: str = ""
    prefill_s: float = 0.0          # estimated prefill work it adds (peer replicas count it too)

    @property
    def local_prefill(self) -> bool:
        return self.prefill is None


@dataclass(frozen=True, slots=True)
class RouterConfig:
    cost: CostModel = field(default_factory=CostModel)
    pd: PdConfig = field(default_factory=PdConfig)
    prediction_ttl_s: float = 2.0   # predicted index entries count this long after routing
    sticky_overload_factor: float = 2.0  # a sticky worker at this many times its fair share of load yields


def validate(query: RouteQuery, block_size: int) -> None:
    """Raises ValueError (INVALID_ARGUMENT) for a request no worker could serve."""
    if not query.request_id:
        raise ValueError("request_id is required")
    if query.num_prompt_tokens < 1:
        raise ValueError("num_prompt_tokens must be >= 1")
    if len(query.block_hashes) > query.num_prompt_tokens // block_size:
        raise ValueError(
            f"{len(query.block_hashes)} block hashes for {query.num_prompt_tokens} prompt tokens: "
            f"more than the full blocks of size {block_size} (does the gateway use the mesh block size?)"
        )
    if any(not h or len(h) > MAX_HASH_BYTES for h in query.block_hashes):
        raise ValueError(f"block hashes must be 1..{MAX_HASH_BYTES} bytes")


class Router:
    def __init__(
        self, registry: Registry, index: BlockIndex, policy: Policy, sticky: StickySessions, config: RouterConfig,
        prewarm: Prewarmer | None = None,
    ) -> None:
        self.registry = registry
        self.index = index
        self.policy = policy
        self.sticky = sticky
        self.config = config
        self.prewarm = prewarm  # hot prefixes, and decode workers to pre-warm when they join

    @property
    def block_size(self) -> int:
        return self.config.cost.block_size

    # --- state from the bus ---

    def observe_heartbeat(self, hb: HeartbeatInfo) -> int | None:
        """Records a heartbeat; returns a replay `from_seq` when the worker's KV events have a gap."""
        seen = self.registry.observe(hb)
        if seen is Seen.RESTARTED:
            self.index.drop_worker(hb.worker_id)
            self.sticky.forget_worker(hb.worker_id)
        if seen is not Seen.UPDATED and hb.role is Role.DECODE and self.prewarm is not None:
            self.prewarm.joined(hb.worker_id)
        return self.index.check_seq(hb.worker_id, hb.kv_event_seq)

    def sweep(self) -> list[str]:
        """Drops workers whose heartbeats stopped (and their index entries); returns their ids."""
        dead = self.registry.expire()
        for worker_id in dead:
            self.index.drop_worker(worker_id)
            self.sticky.forget_worker(worker_id)
            if self.prewarm is not None:
                self.prewarm.forget(worker_id)
        self.index.prune_predictions(self.registry.clock())
        return dead

    # --- requests ---

    def has_decode_workers(self, pool: str = "") -> bool:
        return bool(self.registry.live(Role.DECODE, pool or self.registry.production_pool))

    def pool_for(self, query: RouteQuery) -> str:
        """The pool the query names; else the production pool, or the canary pool for its share of
        production traffic while that has a decode worker to take it."""
        if query.pool:
            return query.pool
        split = self.registry.split
        pool = split.pool_for(query.session_id or query.request_id)
        if pool != split.production and not self.registry.live(Role.DECODE, pool, query.exclude):
            return split.production
        return pool

    def route(self, query: RouteQuery) -> RouteDecision:
        validate(query, self.block_size)
        pool = self.pool_for(query)
        decodes = self.registry.live(Role.DECODE, pool, query.exclude)
        if not decodes:
            excluded = f" (excluding {', '.join(sorted(query.exclude))})" if query.exclude else ""
            raise NoWorkerAvailable(f"no decode worker available in pool {pool!r}{excluded}")
        self.registry.complete(query.request_id)  # NOTE: a retry replaces the previous attempt
        now = self.registry.clock()
        if self.prewarm is not None:
            self.prewarm.observe_route(query.block_hashes, now)
        prefills = self.registry.live(Role.PREFILL, pool, query.exclude)
        stores = self.registry.live(Role.KVSTORE)
        ids = [w.worker_id for w in (*decodes, *prefills, *stores)]
        overlap = self.index.overlap(ids, query.block_hashes, now if self.policy.predicts else None)
        request = RequestView(query.request_id, query.num_prompt_tokens, query.block_hashes, query.session_id, query.max_tokens)
        decode_views = tuple(self._view(w, overlap, now) for w in decodes)

        sticky_id = self.sticky.get(query.session_id, now)
        by_id = {w.worker_id: w for w in decodes}
        if sticky_id in by_id and self._sticky_overloaded(by_id[sticky_id], decodes):
            sticky_id = None
        if sticky_id in by_id:
            decode_id = sticky_id
        else:
            decode_id = self.policy.choose(RoutingState(request, decode_views, self.config.cost)).worker_id
        decode_view = next(v for v in decode_views if v.worker_id == decode_id)
        store_blocks = self.index.union_overlap([w.worker_id for w in stores], query.block_hashes)
        pd = decide(request, decode_view, [self._view(w, overlap, now) for w in prefills], self.config.cost, self.config.pd, store_blocks)
        prefill_s = self._commit(query, decode_view, pd, now)
        prefill = None if pd.local else self.registry.get(pd.prefill_id)  # type: ignore[arg-type]
        # NOTE: the reply names blocks the index has confirmed, not routing-time predictions.
        confirmed = self.index.overlap([decode_id] + ([] if pd.local else [pd.prefill_id]), query.block_hashes)  # type: ignore[list-item]
        return RouteDecision(
            request_id=query.request_id,
            decode=Target(decode_id, by_id[decode_id].info.endpoint),
            prefill=None if prefill is None else Target(prefill.worker_id, prefill.info.endpoint),
            decode_cached_blocks=confirmed[decode_id],
            prefill_cached_blocks=0 if pd.local else confirmed[pd.prefill_id],  # type: ignore[index]
            policy=self.policy.name,
            pool=pool,
            sticky=sticky_id == decode_id,
            pd_reason=pd.reason,
            prefill_s=prefill_s,
        )

    def complete(self, request_id: str) -> Assignment | None:
        return self.registry.complete(request_id)

    def prewarm_plans(self) -> list[tuple[str, list[tuple[bytes, ...]]]]:
        """Decode workers that joined since the last call, each with the hottest prefixes a KV store
        holds (see prewarm.py); [] without pre-warming."""
        if self.prewarm is None or not self.prewarm.pending:
            return []
        in_store: set[bytes] = set().union(*(self.index.held(s.worker_id) for s in self.registry.live(Role.KVSTORE)))
        return self.prewarm.take(self.registry.clock(), in_store.__contains__)

    def observe_peer_route(self, decode_id: str, prefill_id: str | None, block_hashes: Sequence[bytes], prefill_s: float) -> None:
        """A peer replica routed a request: count its load here, and its blocks as predicted."""
        self.registry.observe_peer_route(decode_id, prefill_id, prefill_s)
        if self.policy.predicts and block_hashes:
            expires = self.registry.clock() + self.config.prediction_ttl_s
            for worker_id in (decode_id,) if prefill_id is None else (decode_id, prefill_id):
                if self.registry.get(worker_id) is not None:
                    self.index.predict(worker_id, block_hashes, expires)

    # --- internals ---

    def _sticky_overloaded(self, worker: Worker, decodes: Sequence[Worker]) -> bool:
        loads = [w.load for w in decodes]
        return overloaded(worker.load, worker.capacity, loads, self.config.sticky_overload_factor)

    def _view(self, worker: Worker, overlap: dict[str, int], now: float) -> WorkerView:
        return WorkerView(worker.worker_id, worker.load, worker.capacity, overlap.get(worker.worker_id, 0), worker.backlog(now))

    def _commit(self, query: RouteQuery, decode: WorkerView, pd: PdDecision, now: float) -> float:
        bs = self.block_size
        cached = decode.cached_blocks if pd.local else max(pd.prefill_cached_blocks, 0)
        prefill_s = self.config.cost.prefill_s(query.num_prompt_tokens - cached * bs)
        self.registry.assign(query.request_id, decode.worker_id, pd.prefill_id, prefill_s)
        if self.policy.predicts and query.block_hashes:
            expires = now + self.config.prediction_ttl_s
            targets: Sequence[str] = [decode.worker_id] if pd.local else [decode.worker_id, pd.prefill_id]  # type: ignore[list-item]
            for worker_id in targets:
                self.index.predict(worker_id, query.block_hashes, expires)
        self.sticky.put(query.session_id, decode.worker_id, now)
        return prefill_s
