"""Blocking work off an event loop: `Offload.run(fn, ...)` on threads of its own, bounded.

Bytes work (checksums, copies, int8/int4 (de)quantization, disk reads and writes) takes about a
millisecond per MiB; at 8B sizes a KV block is 2 MiB, so a 512-token prompt done on an event
loop stalls every other stream or RPC of that process for tens of ms. Its two uses:

- the workers' codec pool (`kvmesh.worker.kvtensor.codec_pool`): a few threads (zlib.crc32 and
  torch copies release the GIL), at most `max_pending` jobs admitted at once; callers past that
  wait on the event loop without holding bytes, which bounds the memory in flight;
- the KV store's owner thread (`threads=1`): BlockStore is a plain synchronous core, and one
  thread that runs all its calls keeps it single-threaded without locks inside it. `locked` runs
  a synchronous caller's call (the KV event publisher's full dump) exclusive with that thread.

After `close`, `run` calls `fn` in the caller (a stopped service's last calls still complete).
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


class Offload:
    """`threads` threads named `name`-N; at most `max_pending` calls admitted (0 = no bound, for
    callers that each await their own call); see the module docstring."""

    def __init__(self, name: str, threads: int = 1, max_pending: int = 0) -> None:
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix=name)
        self._slots = asyncio.Semaphore(max_pending) if max_pending > 0 else None
        self._owner = threading.Lock() if threads == 1 else None
        self._closed = False

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """`fn(*args, **kwargs)` on one of the threads; the caller's loop keeps serving meanwhile.
        Its result or exception comes back."""
        call = functools.partial(self._call, fn, *args, **kwargs)
        if self._slots is None:
            return await self._submit(call)
        async with self._slots:
            return await self._submit(call)

    def locked(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """`fn(...)` in the caller, never at the same time as a call on the (single) thread."""
        if self._owner is None:
            raise TypeError("locked() needs a single-thread Offload (the thread owns what it runs)")
        return self._call(fn, *args, **kwargs)

    def close(self, wait: bool = True) -> None:
        """Stops the threads (`wait`: after the calls already submitted; else those are dropped)."""
        self._closed = True
        self._executor.shutdown(wait=wait, cancel_futures=not wait)

    async def _submit(self, call: Callable[[], T]) -> T:
        if self._closed:
            return call()
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    def _call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        if self._owner is None:
            return fn(*args, **kwargs)
        with self._owner:
            return fn(*args, **kwargs)
