"""NATS shell for scheduler replicas: replica heartbeats and shared routing-time predictions.

Subjects (docs/replicas.md):
- `kvmesh.schedulers.<replica_id>.heartbeat` (SchedulerHeartbeat): tells peers this replica is
  alive, so each knows its admission share (`replicas.ReplicaSet`), and carries the pool split
  it routes by: a replica adopts a newer split than its own (a promote made on one replica
  reaches all of them within a heartbeat; a replica that joins late learns it the same way).
- `kvmesh.schedulers.predictions` (RoutePredictions): each routed request's workers, prefill
  work and the blocks it is about to create there. Peers count it in those workers' load until
  their next heartbeat, and enter the blocks into their own index as predictions with the same
  TTL, so replicas routing at once see each other's choices instead of all herding one worker.
- `kvmesh.schedulers.sync` (SchedulerHeartbeat -> ListWorkersResponse, request/reply): a replica
  that starts asks which workers its peers hear (`sync.py`); a peer heartbeats, then answers.
- `kvmesh.schedulers.completions` (RouteCompleted): a routed request completed; peers stop
  counting it in its decode worker's load (until the next heartbeat, as for their own).
  NOTE: without the load part, 4 replicas in `kvmesh sim --routers 4` (32 workers) kept 13% of
  one replica's capacity: each saw only its own quarter of the requests it sent a warm worker.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from google.protobuf.message import Message

from kvmesh.runtime.bus import Bus
from kvmesh.runtime.pb import events_pb2

from .registry import Assignment
from .replicas import ReplicaSet
from .split import PoolSplit
from .router import MAX_HASH_BYTES, RouteDecision, RouteQuery, Router

log = logging.getLogger(__name__)

REPLICA_HEARTBEAT_SUBJECT = "kvmesh.schedulers.{replica_id}.heartbeat"
REPLICA_HEARTBEAT_WILDCARD = "kvmesh.schedulers.*.heartbeat"
PREDICTIONS_SUBJECT = "kvmesh.schedulers.predictions"
COMPLETIONS_SUBJECT = "kvmesh.schedulers.completions"
SYNC_SUBJECT = "kvmesh.schedulers.sync"  # request/reply: a starting replica asks (sync.py)
MAX_PREDICTED_BLOCKS = 1 << 16  # a prompt of a million tokens at block size 16


def predictions_of(replica_id: str, query: RouteQuery, decision: RouteDecision, ttl_s: float) -> events_pb2.RoutePredictions:
    targets = [decision.decode.worker_id] + ([] if decision.prefill is None else [decision.prefill.worker_id])
    return events_pb2.RoutePredictions(
        replica_id=replica_id, request_id=query.request_id, ttl_s=ttl_s,
        predictions=[events_pb2.WorkerPrediction(worker_id=w, block_hashes=query.block_hashes) for w in targets],
        decode_worker=decision.decode.worker_id, prefill_worker=decision.prefill.worker_id if decision.prefill else "",
        prefill_s=decision.prefill_s,
    )


class Peers:
    """Heartbeats this replica, tracks its peers, and shares predictions with them.

    `on_change()` runs when the set of live replicas changes (admission shares move)."""

    def __init__(
        self, router: Router, bus: Bus, replicas: ReplicaSet, endpoint: str, on_change: Callable[[], None],
        interval_s: float = 0.5,
    ) -> None:
        self.router = router
        self.bus = bus
        self.replicas = replicas
        self.endpoint = endpoint
        self.on_change = on_change
        self.interval_s = interval_s
        self.started_at = time.time()
        self.split_set_at = 0.0  # when registry.split was last set (here or by a peer)
        self.predictions_received = 0
        self._task: asyncio.Task[None] | None = None
        self._pending: set[asyncio.Task[None]] = set()

    @property
    def replica_id(self) -> str:
        return self.replicas.self_id

    async def start(self) -> None:
        await self.bus.subscribe(REPLICA_HEARTBEAT_WILDCARD, events_pb2.SchedulerHeartbeat, self._on_heartbeat)
        await self.bus.subscribe(PREDICTIONS_SUBJECT, events_pb2.RoutePredictions, self._on_predictions)
        await self.bus.subscribe(COMPLETIONS_SUBJECT, events_pb2.RouteCompleted, self._on_completed)

    def start_heartbeats(self) -> None:
        """Starts this replica's heartbeats: peers count it (and shrink their admission share)
        from now on, so a starting replica calls this once synced and serving."""
        self.bus.on_reconnect(self._beat)
        self._task = asyncio.create_task(self._loop(), name="scheduler-replica-heartbeat")

    async def answer_sync(self, workers: Callable[[], Message]) -> None:
        """Answers a starting replica's `kvmesh.schedulers.sync` request with `workers()` (the
        ListWorkers reply) after a heartbeat of ours, so it hears this peer at once (sync.py)."""

        async def on_sync(request: events_pb2.SchedulerHeartbeat, msg) -> None:  # noqa: ANN001
            if request.replica_id == self.replica_id or not msg.reply:
                return
            await self._beat()
            await msg.respond(workers().SerializeToString())

        await self.bus.subscribe(SYNC_SUBJECT, events_pb2.SchedulerHeartbeat, on_sync)

    async def stop(self) -> None:
        tasks = [t for t in (self._task, *self._pending) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def routed(self, query: RouteQuery, decision: RouteDecision) -> None:
        """Shares a decision's predictions (fire-and-forget; a lost one only costs accuracy)."""
        if self.replicas.count < 2:
            return
        self._send(PREDICTIONS_SUBJECT, predictions_of(self.replica_id, query, decision, self.router.config.prediction_ttl_s))

    def completed(self, assignment: Assignment) -> None:
        """A request this replica routed completed: peers stop counting its load."""
        if self.replicas.count >= 2:
            self._send(COMPLETIONS_SUBJECT, events_pb2.RouteCompleted(
                replica_id=self.replica_id, request_id=assignment.request_id, decode_worker=assignment.decode_id))

    def _send(self, subject: str, message: Message) -> None:
        task = asyncio.create_task(self._publish(subject, message))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _publish(self, subject: str, message: Message) -> None:
        try:
            await self.bus.publish(subject, message)
        except Exception as exc:  # noqa: BLE001 - NATS away: peers route without it
            log.debug("not published on %s: %s", subject, exc)

    def split_changed(self) -> None:
        """SetProductionPool changed the split here: tell the peers now."""
        self.split_set_at = time.time()
        self._send(REPLICA_HEARTBEAT_SUBJECT.format(replica_id=self.replica_id), self._heartbeat())

    def _heartbeat(self) -> events_pb2.SchedulerHeartbeat:
        split = self.router.registry.split
        return events_pb2.SchedulerHeartbeat(
            replica_id=self.replica_id, endpoint=self.endpoint, started_at=self.started_at, timestamp=time.time(),
            production_pool=split.production, canary_pool=split.canary, canary_weight=split.canary_weight,
            split_set_at=self.split_set_at,
        )

    async def _beat(self) -> None:
        await self._publish(REPLICA_HEARTBEAT_SUBJECT.format(replica_id=self.replica_id), self._heartbeat())

    async def _loop(self) -> None:
        while True:
            await self._beat()
            if self.bus.connected and self.replicas.expire():
                # NOTE: only while connected: silence during a NATS blip is not a dead peer.
                self.on_change()
            await asyncio.sleep(self.interval_s)

    async def _on_heartbeat(self, hb: events_pb2.SchedulerHeartbeat, _msg) -> None:  # noqa: ANN001
        if not hb.replica_id:
            return
        count = self.replicas.count
        if self.replicas.observe(hb.replica_id, hb.endpoint, hb.started_at):
            log.info("scheduler replica %s at %s joined", hb.replica_id, hb.endpoint)
        if self.replicas.count != count:
            self.on_change()
        if hb.replica_id != self.replica_id and hb.split_set_at > self.split_set_at:
            self._adopt_split(hb)

    def _adopt_split(self, hb: events_pb2.SchedulerHeartbeat) -> None:
        try:
            split = PoolSplit(hb.production_pool, hb.canary_pool, hb.canary_weight)
        except ValueError as exc:
            log.warning("ignored an invalid pool split from replica %s: %s", hb.replica_id, exc)
            return
        self.router.registry.split, self.split_set_at = split, hb.split_set_at
        log.info("production pool %r, canary pool %r at %.0f%% (set on replica %s)",
                 split.production, split.canary, 100 * split.canary_weight, hb.replica_id)

    async def _on_predictions(self, message: events_pb2.RoutePredictions, _msg) -> None:  # noqa: ANN001
        if message.replica_id == self.replica_id or not message.decode_worker:
            return
        hashes = message.predictions[0].block_hashes if message.predictions else []
        if len(hashes) > MAX_PREDICTED_BLOCKS or any(not h or len(h) > MAX_HASH_BYTES for h in hashes):
            self.bus.malformed += 1
            return
        prefill_s = min(max(message.prefill_s, 0.0), 600.0)
        self.router.observe_peer_route(message.decode_worker, message.prefill_worker or None, list(hashes), prefill_s)
        self.predictions_received += 1

    async def _on_completed(self, message: events_pb2.RouteCompleted, _msg) -> None:  # noqa: ANN001
        if message.replica_id != self.replica_id and message.decode_worker:
            self.router.registry.observe_peer_complete(message.decode_worker)
