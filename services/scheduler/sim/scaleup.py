"""`kvmesh sim --scale-up N`: N decode workers join a busy mesh mid-trace, with and without KV
pre-warming, the real Router and Prewarmer deciding.

The mesh starts with `workers - N` decode workers; at `join_at_s` N more join (they register at
their first heartbeat). With pre-warming the router's Prewarmer plans each joiner's hottest
prefixes; blocks some worker holds stand in for the KV store's (every finished turn is handed to
it), and they land in the joiner's cache after blocks × block_size × kv_transfer_s_per_token.
Meanwhile the joiner is routed to as a cold worker. Figures: the joiners' first 20 requests'
TTFT, and the whole mesh's TTFT in the `window_s` after the join.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

from ..prewarm import PrewarmConfig, Prewarmer, count_blocks
from ..registry import Role
from .cluster import Cluster, SimConfig
from .report import quantile
from .trace import TraceRequest

FIRST_REQUESTS = 20


class ScaleUpCluster(Cluster):
    """A Cluster whose last `joining` decode workers join at `join_at_s` (pre-warmed when `prewarm`)."""

    def __init__(self, policy_name: str, config: SimConfig, joining: int, join_at_s: float,
                 prewarm: PrewarmConfig | None) -> None:
        super().__init__(policy_name, config)
        decode_ids = sorted(w.worker_id for w in self.workers.values() if w.role is Role.DECODE)
        self.joiners = {i: self.workers.pop(i) for i in decode_ids[len(decode_ids) - joining:]}
        self.join_at_s = join_at_s
        self.prewarmed_blocks = 0
        self._landing: list[tuple[float, str, tuple[bytes, ...]]] = []
        if prewarm is not None:
            self.router.prewarm = Prewarmer(prewarm)

    def _arrive(self, r: TraceRequest) -> None:
        self._land()
        super()._arrive(r)

    def _heartbeats(self) -> None:
        if self.now >= self.join_at_s and not set(self.joiners) <= set(self.workers):
            for worker in self.joiners.values():
                worker.load_since = self.now
            self.workers.update(self.joiners)
        super()._heartbeats()
        self._plan()
        self._land()

    def _plan(self) -> None:
        prewarm = self.router.prewarm
        if prewarm is None or not prewarm.pending:
            return
        held = set().union(*(self.router.index.held(w) for w in self.workers if w not in prewarm.pending))
        for worker_id, prefixes in prewarm.take(self.now, held.__contains__):
            blocks = tuple(dict.fromkeys(h for prefix in prefixes for h in prefix))
            fetch_s = count_blocks(prefixes) * self.config.cost.block_size * self.config.kv_transfer_s_per_token
            self._landing.append((self.now + fetch_s, worker_id, blocks))

    def _land(self) -> None:
        due = [entry for entry in self._landing if entry[0] <= self.now]
        for entry in due:
            self._landing.remove(entry)
            _, worker_id, blocks = entry
            worker = self.workers[worker_id]
            stored, removed = worker.insert(blocks)
            self.prewarmed_blocks += len(stored)
            self._publish(worker, stored, removed)
            self.router.prewarm.done(worker_id, self.now)  # type: ignore[union-attr]


@dataclass(frozen=True, slots=True)
class ScaleUpSummary:
    prewarm: bool
    joiners_ttft_p50_s: float
    joiners_ttft_p99_s: float
    joiners_hit_rate: float
    mesh_ttft_p99_s: float
    prewarmed_blocks: int
    joiners_share: float  # of the requests in the window after the join, the share the joiners served


def scale_up(policy: str, config: SimConfig, requests: list[TraceRequest], joining: int, join_at_s: float,
             window_s: float, prewarm: PrewarmConfig | None) -> ScaleUpSummary:
    cluster = ScaleUpCluster(policy, config, joining, join_at_s, prewarm)
    results = cluster.run(requests)
    firsts = []
    for worker_id in cluster.joiners:
        mine = sorted((r for r in results if r.decode_id == worker_id), key=lambda r: r.request.arrival_s)
        firsts += mine[:FIRST_REQUESTS]
    window = [r for r in results if join_at_s <= r.request.arrival_s < join_at_s + window_s]
    after = [r.ttft_s for r in window]
    prompt = sum(r.request.prompt_tokens for r in firsts)
    return ScaleUpSummary(
        prewarm is not None,
        quantile([r.ttft_s for r in firsts], 0.5),
        quantile([r.ttft_s for r in firsts], 0.99),
        sum(r.cached_tokens for r in firsts) / max(1, prompt),
        quantile(after, 0.99),
        cluster.prewarmed_blocks,
        sum(r.decode_id in cluster.joiners for r in window) / max(1, len(window)),
    )


def scale_up_main(args: argparse.Namespace, config_for: Callable[[int], SimConfig],
                  trace_at: Callable[[float], tuple[list[TraceRequest], tuple[float, float] | None]]) -> int:
    """One table per worker count: the same trace, the same joiners, pre-warming off and on."""
    policy = args.policy if args.policy != "all" else "kv_aware"
    join_at = args.join_at_s if args.join_at_s > 0 else args.warmup_s
    budget = PrewarmConfig(budget_blocks=args.prewarm_budget_blocks)
    print(f"# scale-up: {args.scale_up} decode workers join at {join_at:g} s; policy {policy}; "
          f"pre-warm budget {budget.budget_blocks} blocks; first {FIRST_REQUESTS} requests per joiner")
    print("| workers | pre-warm | joiners' TTFT p50 | joiners' TTFT p99 | joiners' hit rate | joiners' share | "
          "mesh TTFT p99 after join | blocks pre-warmed |")
    print("|---|---|---|---|---|---|---|---|")
    for n in (int(x) for x in args.workers.split(",")):
        requests, _ = trace_at(args.rate * n if args.rate else 8.0 * n)
        rows = [scale_up(policy, config_for(n), requests, args.scale_up, join_at, args.window_s, p) for p in (None, budget)]
        for s in rows:
            print(f"| {n - args.scale_up} → {n} | {'on' if s.prewarm else 'off'} | {s.joiners_ttft_p50_s * 1e3:.1f} ms | "
                  f"{s.joiners_ttft_p99_s * 1e3:.1f} ms | {s.joiners_hit_rate:.2f} | {s.joiners_share:.2f} | {s.mesh_ttft_p99_s * 1e3:.1f} ms | "
                  f"{s.prewarmed_blocks} |", flush=True)
        off, on = rows
        print(f"# {n} workers: with/without pre-warming: joiners' TTFT p50 "
              f"{on.joiners_ttft_p50_s / max(off.joiners_ttft_p50_s, 1e-9):.2f}x, mesh TTFT p99 after the join "
              f"{on.mesh_ttft_p99_s / max(off.mesh_ttft_p99_s, 1e-9):.2f}x", flush=True)
    return 0
