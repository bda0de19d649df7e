"""gRPC adapter: Scheduler.Route / Complete / Routes / ListWorkers / SetProductionPool."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable

from opentelemetry.context import Context

from kvmesh.runtime.errors import InvalidArgument, ResourceExhausted, Unavailable
from kvmesh.runtime.pb import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from kvmesh.runtime.grpcutil import BATCH_METADATA, peer_batches
from kvmesh.runtime.telemetry import tracer

from . import metrics
from .admission import AdmissionQueue, QueueFull
from .registry import Assignment, Role
from .replicas import ReplicaSet
from .routestream import RouteStreamSession
from .router import NoWorkerAvailable, RouteDecision, RouteQuery, Router, validate
from .split import PoolSplit

log = logging.getLogger(__name__)


class AdmissionGate:
    """Async waiting on the pure AdmissionQueue: one future per queued request."""

    def __init__(self, queue: AdmissionQueue) -> None:
        self.queue = queue
        self._waiters: dict[str, asyncio.Future[None]] = {}

    async def acquire(self, request_id: str, cost: int, priority: int = 0) -> None:
        """Returns once the request holds a slot; raises QueueFull when the queue is full."""
        if self.queue.offer(request_id, cost, priority):
            return
        future = asyncio.get_running_loop().create_future()
        self._waiters[request_id] = future
        metrics.QUEUE_DEPTH.set(self.queue.depth)
        try:
            await future
        except asyncio.CancelledError:
            if self._waiters.get(request_id) is future:
                del self._waiters[request_id]  # NOTE: else every cancelled wait left its future here
            self.release(request_id)
            raise

    def release(self, request_id: str) -> None:
        self._wake(self.queue.release(request_id))

    def resize(self, total_max_num_seqs: int) -> None:
        self._wake(self.queue.set_capacity(total_max_num_seqs))

    def reclaim(self) -> None:
        self._wake(self.queue.reclaim())

    def _wake(self, admitted: list[str]) -> None:
        for request_id in admitted:
            future = self._waiters.pop(request_id, None)
            if future is not None and not future.done():
                future.set_result(None)
        metrics.QUEUE_DEPTH.set(self.queue.depth)


def query_from_pb(request: scheduler_pb2.RouteRequest) -> RouteQuery:
    return RouteQuery(
        request_id=request.request_id,
        num_prompt_tokens=request.num_prompt_tokens,
        block_hashes=tuple(request.block_hashes),
        session_id=request.session_id,
        max_tokens=request.max_tokens,
        pool=request.pool,
        exclude=frozenset(request.exclude_workers),
    )


def decision_to_pb(decision: RouteDecision, queue_wait_s: float) -> scheduler_pb2.RouteResponse:
    reply = scheduler_pb2.RouteResponse(
        decode=common_pb2.WorkerRef(worker_id=decision.decode.worker_id, endpoint=decision.decode.endpoint),
        local_prefill=decision.local_prefill,
        decode_cached_blocks=decision.decode_cached_blocks,
        prefill_cached_blocks=decision.prefill_cached_blocks,
        policy=decision.policy,
        pool=decision.pool,
        queue_wait_s=queue_wait_s,
    )
    if decision.prefill is not None:
        reply.prefill.CopyFrom(common_pb2.WorkerRef(worker_id=decision.prefill.worker_id, endpoint=decision.prefill.endpoint))
    return reply


class SchedulerServicer(scheduler_pb2_grpc.SchedulerServicer):
    def __init__(self, router: Router, gate: AdmissionGate) -> None:
        self.router = router
        self.gate = gate
        self.on_routed: Callable[[RouteQuery, RouteDecision], None] | None = None  # shares predictions with peers
        self.on_split: Callable[[], None] | None = None  # tells peers about a new pool split
        self.on_completed: Callable[[Assignment], None] | None = None  # tells peers a routed request ended
        self.until_synced: Callable[[], Awaitable[None]] | None = None  # start-up sync (sync.py)

    async def Route(self, request: scheduler_pb2.RouteRequest, context) -> scheduler_pb2.RouteResponse:  # noqa: ANN001, N802
        return await self.route(request)

    async def Complete(self, request: scheduler_pb2.CompleteRequest, context) -> scheduler_pb2.CompleteResponse:  # noqa: ANN001, N802
        if not request.request_id:
            raise InvalidArgument("request_id is required")
        self.complete(request.request_id)
        return scheduler_pb2.CompleteResponse()

    async def Routes(self, request_iterator, context):  # noqa: ANN001, ANN201, N802
        """Route and Complete multiplexed on one call (routestream.py)."""
        await context.send_initial_metadata((BATCH_METADATA,))  # NOTE: we read packed frames
        session = RouteStreamSession(self, batch_replies=peer_batches(context.invocation_metadata()))
        async for out in session.serve(request_iterator):
            yield out

    async def route(self, request: scheduler_pb2.RouteRequest, parent: Context | None = None) -> scheduler_pb2.RouteResponse:
        """One Route, unary or on the stream: validation, start-up sync, admission (may wait),
        the routing decision. `parent` is the request's trace context (None: the current one)."""
        query = query_from_pb(request)
        validate(query, self.router.block_size)
        if self.until_synced is not None:
            await self.until_synced()
        attributes = {"kvmesh.request_id": query.request_id, "kvmesh.policy": self.router.policy.name,
                      "kvmesh.priority": request.priority}
        with tracer.start_as_current_span("scheduler.route", context=parent, attributes=attributes) as span:
            if not self.router.has_decode_workers(query.pool):
                raise Unavailable(f"no decode worker in pool {query.pool or self.router.registry.production_pool!r}")
            loop = asyncio.get_running_loop()
            started = loop.time()
            try:
                await self.gate.acquire(query.request_id, query.num_prompt_tokens, request.priority)
            except QueueFull as exc:
                metrics.REJECTED.inc()
                raise ResourceExhausted(str(exc), exc.retry_after_s) from None
            try:
                decision = self.router.route(query)
            except NoWorkerAvailable as exc:
                self.gate.release(query.request_id)
                raise Unavailable(str(exc)) from None
            except BaseException:
                self.gate.release(query.request_id)
                raise
            metrics.ADMISSION_WAIT.labels(metrics.priority_class(request.priority)).observe(loop.time() - started)
            prefill = "local" if decision.local_prefill else "remote"
            metrics.ROUTE_DECISIONS.labels(decision.policy, prefill).inc()
            metrics.ROUTE_OVERLAP_BLOCKS.labels(decision.policy).observe(decision.decode_cached_blocks)
            span.set_attributes({
                "kvmesh.decode_worker": decision.decode.worker_id,
                "kvmesh.prefill_worker": decision.prefill.worker_id if decision.prefill else "local",
                "kvmesh.overlap_blocks": decision.decode_cached_blocks,
            })
            if self.on_routed is not None:
                self.on_routed(query, decision)
            return decision_to_pb(decision, loop.time() - started)

    def complete(self, request_id: str) -> None:
        """A routed request ended: its load and admission slot (or queue place) are released."""
        assignment = self.router.complete(request_id)
        self.gate.release(request_id)
        if assignment is not None and self.on_completed is not None:
            self.on_completed(assignment)

    async def ListWorkers(self, request: scheduler_pb2.ListWorkersRequest, context) -> scheduler_pb2.ListWorkersResponse:  # noqa: ANN001, N802
        return workers_reply(self.router)

    async def SetProductionPool(self, request: scheduler_pb2.SetProductionPoolRequest, context):  # noqa: ANN001, ANN201, N802
        try:
            split = PoolSplit(request.pool, request.canary_pool, request.canary_weight)
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None
        registry = self.router.registry
        previous, registry.split = registry.production_pool, split
        if self.on_split is not None:
            self.on_split()
        log.info("production pool %r; canary pool %r takes %.0f%%", split.production, split.canary, 100 * split.canary_weight)
        return scheduler_pb2.SetProductionPoolResponse(previous_pool=previous)


def workers_reply(router: Router) -> scheduler_pb2.ListWorkersResponse:
    """Every known worker and the pool split (ListWorkers; also a starting peer's sync answer)."""
    registry = router.registry
    now = registry.clock()
    split = registry.split
    reply = scheduler_pb2.ListWorkersResponse(
        production_pool=split.production, canary_pool=split.canary, canary_weight=split.canary_weight
    )
    for w in registry.all():
        info = w.info
        reply.workers.add(
            worker_id=info.worker_id,
            role=int(info.role),
            endpoint=info.endpoint,
            pool=info.pool,
            model=info.model,
            num_running=info.num_running,
            num_waiting=info.num_waiting,
            kv_blocks_total=info.kv_blocks_total,
            kv_blocks_free=info.kv_blocks_free,
            last_seen_age_s=max(0.0, now - w.last_seen),
            draining=info.draining,
            inflight=w.inflight,
            max_model_len=info.max_model_len,
            warming=bool(router.prewarm and router.prewarm.is_warming(info.worker_id)),
        )
    return reply


def refresh(router: Router, gate: AdmissionGate, counters: metrics.IndexCounters, replicas: ReplicaSet | None = None) -> None:
    """Re-derives admission capacity and gauges from the registry and index (cheap; run often).
    With scheduler replicas, this one admits its share of the mesh-wide limit (replicas.py)."""
    registry = router.registry
    for orphan in registry.drain_orphaned():
        gate.release(orphan.request_id)
    gate.reclaim()  # slots whose Complete never came (a crashed client) time out
    decodes = registry.live(Role.DECODE)
    total = sum(w.capacity for w in decodes)
    gate.resize(total if replicas is None else replicas.share(total))
    if replicas is not None:
        metrics.REPLICAS.set(replicas.count)
    metrics.WORKER_COUNTS.update(Counter((w.info.role.name.lower(), w.info.pool) for w in registry.all()))
    metrics.ASSIGNMENTS.set(registry.open_assignments())
    metrics.ADMITTED.set(gate.queue.active)
    stats = router.index.stats
    counters.update(stats.batches_applied, stats.gaps, router.index.num_entries)
