"""The NATS control plane: protobuf messages on subjects, trace context in headers, reconnects.

Services keep working on what they know while NATS is away; nats-py reconnects forever and
`on_reconnect` callbacks let a service announce itself again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import nats
from google.protobuf.message import DecodeError, Message
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import NoRespondersError  # noqa: F401 - `request` raises it when nobody subscribes

from . import w3c

log = logging.getLogger(__name__)

M = TypeVar("M", bound=Message)

CLOSE_S = 2.0  # how long `close` lets a drain take before it closes the connection anyway

HEARTBEAT_SUBJECT = "kvmesh.workers.{role}.{worker_id}.heartbeat"
HEARTBEAT_WILDCARD = "kvmesh.workers.*.*.heartbeat"
HEARTBEAT_REQUEST_SUBJECT = "kvmesh.workers.heartbeat.request"  # runtime/heartbeats.py
KV_EVENTS_SUBJECT = "kvmesh.kv.events.{worker_id}"
KV_EVENTS_WILDCARD = "kvmesh.kv.events.*"
KV_REPLAY_SUBJECT = "kvmesh.kv.replay.{worker_id}"
KV_PREWARM_SUBJECT = "kvmesh.kv.prewarm.{worker_id}"
MIRROR_SUBJECT = "kvmesh.mirror.requests"


class Bus:
    """A NATS connection that speaks protobuf. Create with `await Bus.connect(url, name)`."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.malformed = 0
        self._reconnect_hooks: list[Callable[[], Awaitable[None]]] = []

    @classmethod
    async def connect(cls, url: str, name: str, connect_timeout_s: float = 5.0, **options) -> Bus:
        bus = cls.__new__(cls)

        async def reconnected() -> None:
            log.info("NATS reconnected (%s)", name)
            for hook in bus._reconnect_hooks:
                await hook()

        async def disconnected() -> None:
            log.warning("NATS disconnected (%s); serving on what we know", name)

        async def error(exc: Exception) -> None:
            log.debug("NATS error (%s): %s", name, exc)

        client = await nats.connect(
            servers=[u.strip() for u in url.split(",") if u.strip()],
            name=name,
            connect_timeout=connect_timeout_s,
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.5,
            allow_reconnect=True,
            reconnected_cb=reconnected,
            disconnected_cb=disconnected,
            error_cb=error,
            **options,
        )
        cls.__init__(bus, client)
        return bus

    def on_reconnect(self, hook: Callable[[], Awaitable[None]]) -> None:
        self._reconnect_hooks.append(hook)

    @property
    def connected(self) -> bool:
        return self.client.is_connected

    async def publish(self, subject: str, message: Message) -> None:
        """Fire-and-forget publish with the current trace context in the headers."""
        headers = w3c.inject()
        await self.client.publish(subject, message.SerializeToString(), headers=headers or None)

    async def subscribe(
        self,
        subject: str,
        message_type: type[M],
        handler: Callable[[M, Msg], Awaitable[None]],
        queue: str = "",
    ) -> None:
        """Calls `handler(parsed, raw)` for each message; malformed payloads are counted and dropped."""

        async def on_message(msg: Msg) -> None:
            parsed = message_type()
            try:
                parsed.ParseFromString(msg.data)
            except DecodeError:
                self.malformed += 1
                log.warning("dropped malformed %s on %s", message_type.__name__, msg.subject)
                return
            try:
                await handler(parsed, msg)
            except Exception:  # noqa: BLE001 - one bad message must not kill the subscription
                log.exception("handler failed for %s", msg.subject)

        await self.client.subscribe(subject, queue=queue, cb=on_message)

    async def request(self, subject: str, message: Message, reply_type: type[M], timeout_s: float = 2.0) -> M:
        headers = w3c.inject()
        msg = await self.client.request(subject, message.SerializeToString(), timeout=timeout_s, headers=headers or None)
        reply = reply_type()
        reply.ParseFromString(msg.data)
        return reply

    async def close(self, timeout_s: float = CLOSE_S) -> None:
        """Drains (what was published goes out, what arrived is handled), for at most `timeout_s`.

        NOTE: with the server gone (a launcher killed takes nats-server down with every service)
        a drain waits for its subscriptions up to nats-py's drain_timeout (30 s) and then a flush
        up to 10 s, and a cancelled drain still flushes: a scheduler took 10 s to exit so on a busy
        host, and the e2e test that kills the launcher once saw a service outlive its 30 s. The
        drain runs as a task; past the bound the connection is closed under it."""
        if self.client.is_closed:
            return
        drain = asyncio.ensure_future(self.client.drain())
        done, _ = await asyncio.wait({drain}, timeout=timeout_s)
        if drain in done and not drain.cancelled() and drain.exception() is None:
            return
        drain.cancel()
        drain.add_done_callback(lambda t: t.cancelled() or t.exception())  # nobody awaits it now
        if not self.client.is_closed:
            await self.client.close()
