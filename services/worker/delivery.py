"""What crosses from an engine (thread or process) to the event loop: a request's `OutputStream`,
`claim`, which finds an output's subscriber, and `call_each`, which runs a batch of consumers so
that one failing never starves the rest."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Any

log = logging.getLogger(__name__)


def call_each(calls: Iterable[tuple[Callable[..., Any], tuple]], what: str) -> None:
    """`fn(*args)` for each pair, in order; one that raises is logged ("<what> failed") and the
    rest still run."""
    for fn, args in calls:
        try:
            fn(*args)
        except Exception:  # noqa: BLE001 - one consumer's bug must not starve the others
            log.exception("%s failed", what)


def claim(subs: dict[str, Any], out: Any) -> Any | None:
    """The subscriber of `out`'s request (None: aborted or unknown), dropped from `subs` with the
    request's last output."""
    sub = subs.get(out.request_id)
    if sub is not None and out.finished:
        del subs[out.request_id]
    return sub


class OutputStream:
    """What the engine thread hands one request: items in order, exceptions re-raised."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[Any] = asyncio.Queue()

    def put(self, item: Any) -> None:
        self._queue.put_nowait(item)

    async def next_batch(self) -> list[Any]:
        """Everything pending (at least one item); raises the first exception delivered."""
        items = [await self._queue.get()]
        while not self._queue.empty():
            items.append(self._queue.get_nowait())
        for item in items:
            if isinstance(item, BaseException):
                raise item
        return items
