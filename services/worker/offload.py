"""KV bytes work (crc, copies, (de)quantization) off the worker's event loop, bounded.

Encoding or decoding one block costs about a millisecond per MiB; at 8B sizes a block is 2 MiB,
so a 512-token prompt done on the event loop stalls every token stream of the worker for tens
of ms. `CodecPool.run(fn, ...)` runs such work on a small thread pool (the codec releases the
GIL in zlib.crc32 and torch copies) and admits at most `max_pending` jobs at once: callers past
that wait on the event loop without holding bytes, which bounds the memory in flight.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


class CodecPool:
    """A bounded thread pool for KV block encode/decode; see the module docstring."""

    def __init__(self, threads: int = 2, max_pending: int = 8, name: str = "kv-codec") -> None:
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix=name)
        self._slots = asyncio.Semaphore(max_pending)

    async def run(self, fn: Callable[..., T], *args: object, **kwargs: object) -> T:
        """`fn(*args, **kwargs)` on a codec thread; its result or exception comes back."""
        async with self._slots:
            return await asyncio.get_running_loop().run_in_executor(self._executor, lambda: fn(*args, **kwargs))

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

