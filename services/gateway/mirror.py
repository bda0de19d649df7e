"""The mirror tap: a sampled copy of finished requests for the canary, published on NATS.

Fire-and-forget: records go into a bounded queue drained by a background task; a full queue or
a missing NATS connection drops the record (and counts it) - the response is never slowed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable

from opentelemetry import context as otel_context

from kvmesh.runtime.bus import MIRROR_SUBJECT, Bus
from kvmesh.runtime.pb import events_pb2

from .metrics import GatewayMetrics

log = logging.getLogger(__name__)

CONNECT_RETRY_S = 2.0


class MirrorTap:
    """`offer(build)` samples a request; `build()` makes its MirrorRecord only when sampled."""

    def __init__(
        self,
        sample: float,
        buffer: int,
        metrics: GatewayMetrics,
        nats_url: str = "",
        bus: Bus | None = None,
        draw: Callable[[], float] = random.random,
    ) -> None:
        self.sample = sample
        self.metrics = metrics
        self.nats_url = nats_url
        self.bus = bus
        self._draw = draw
        # NOTE: each record travels with the trace context of the request it mirrors; the drain
        # task's own context is whichever request happened to start it.
        self._queue: asyncio.Queue[tuple[events_pb2.MirrorRecord, otel_context.Context]] = asyncio.Queue(
            maxsize=max(1, buffer)
        )
        self._tasks: list[asyncio.Task] = []

    @property
    def enabled(self) -> bool:
        return self.sample > 0.0

    def offer(self, build: Callable[[], events_pb2.MirrorRecord]) -> bool:
        """Samples this request (a fresh uniform draw); True when its record was queued."""
        if not self.enabled or self._draw() >= self.sample:
            return False
        self._ensure_started()
        try:
            self._queue.put_nowait((build(), otel_context.get_current()))
        except asyncio.QueueFull:
            self.metrics.mirror_dropped.inc()
            return False
        return True

    def set_sample(self, sample: float) -> None:
        """Changes the sampled fraction at run time (connecting to NATS when it turns on)."""
        self.sample = sample
        self.start()

    def start(self) -> None:
        """Connects to NATS ahead of the first sampled request (nothing happens when mirroring is off)."""
        if self.enabled:
            self._ensure_started()

    def _ensure_started(self) -> None:
        if self._tasks:
            return
        self._tasks.append(asyncio.create_task(self._drain(), name="mirror-drain"))
        if self.bus is None and self.nats_url:
            self._tasks.append(asyncio.create_task(self._connect(), name="mirror-connect"))

    async def _connect(self) -> None:
        # NOTE: NATS is optional: keep trying in the background; nats-py reconnects by itself
        # once a first connection was made.
        while self.bus is None:
            try:
                self.bus = await Bus.connect(self.nats_url, "kvmesh-gateway", connect_timeout_s=2.0)
                log.info("mirror tap connected to NATS at %s", self.nats_url)
            except Exception as exc:  # noqa: BLE001 - any failure: try again later
                log.debug("mirror tap: NATS not reachable (%s)", exc)
                await asyncio.sleep(CONNECT_RETRY_S)

    async def _drain(self) -> None:
        while True:
            record, ctx = await self._queue.get()
            bus = self.bus
            if bus is None or not bus.connected:
                self.metrics.mirror_dropped.inc()
                continue
            token = otel_context.attach(ctx)
            try:
                await bus.publish(MIRROR_SUBJECT, record)
                self.metrics.mirror_published.inc()
            except Exception as exc:  # noqa: BLE001 - mirroring never fails a request
                log.debug("mirror publish failed: %s", exc)
                self.metrics.mirror_dropped.inc()
            finally:
                otel_context.detach(token)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        if self.bus is not None:
            await self.bus.close()
            self.bus = None


def mirror_record(
    request_id: str,
    model: str,
    session_id: str,
    prompt_token_ids: list[int],
    sampling: object,
    output_token_ids: list[int],
    finish_reason: str,
    ttft_s: float,
    tpot_s: float,
    error: str = "",
    pool: str = "",
) -> events_pb2.MirrorRecord:
    record = events_pb2.MirrorRecord(
        request_id=request_id,
        model=model,
        session_id=session_id,
        prompt_token_ids=prompt_token_ids,
        output_token_ids=output_token_ids,
        finish_reason=finish_reason,
        ttft_s=ttft_s,
        tpot_s=tpot_s,
        error=error,
        timestamp=time.time(),
        pool=pool,
    )
    record.sampling.CopyFrom(sampling)
    return record
