"""One thread that owns the BlockStore: the gRPC event loop never does the store's bytes work.

Reads and writes of the disk tier, checksums, copies and int8/int4 (de)quantization take
milliseconds per block at 8B sizes (2 MiB a block). Run on the event loop they stalled every other
RPC of the store for tens of ms per prompt. The async shell sends each store call here instead.

NOTE: one thread, not a pool: BlockStore is a plain synchronous core, and one owner thread keeps it
single-threaded without locks inside it. The queue is bounded by the RPCs in flight, since each
caller awaits its own call. `locked` serves the rare synchronous reader outside the loop's awaits
(the KV event publisher's full dump) under the same lock.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


class StoreThread:
    def __init__(self, name: str = "kvstore-io") -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._lock = threading.Lock()
        self._closed = False

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """`fn(*args, **kwargs)` on the store thread; the caller's loop keeps serving meanwhile."""
        if self._closed:  # a stopped store's last calls (a second stop, say) run here
            return self.locked(fn, *args, **kwargs)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(self.locked, fn, *args, **kwargs))

    def locked(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """`fn(...)` here, excluding the store thread (for synchronous callers)."""
        with self._lock:
            return fn(*args, **kwargs)

    def close(self) -> None:
        self._closed = True
        self._pool.shutdown(wait=True)
