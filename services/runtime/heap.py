"""The C heap (glibc malloc) of a service process: what it holds, and handing freed pages back.

NOTE (issue 16, the soak): a worker allocates and frees many mid-sized buffers (KV blocks of
128 KiB to 2 MiB as bytes, tensors, protobuf frames) on several threads: the event loop, the
codec pool, the engine thread, gRPC's. glibc gives each thread its own arena and returns an
arena's free memory to the OS only from the top of its heap, so the pages behind a freed buffer
in the middle stay resident: a prefill worker's arenas held 300 MiB for 129 MiB in use, and the
workers' RSS kept creeping up under steady traffic while what they held did not. `trim_heap`
runs `malloc_trim(0)` every `interval_s` (on a thread: it takes each arena's lock briefly),
which hands every free page of every arena back (madvise). `heap_bytes` reads mallinfo2 for the
`kvmesh_process_heap_bytes` gauge (workers and the KV store, which import this module), so
"RSS grows, in-use does not" is visible on /metrics.
Elsewhere than glibc both do nothing.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import threading

from prometheus_client import Gauge

log = logging.getLogger(__name__)


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim.argtypes, libc.malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
        libc.mallinfo2.restype = _MallInfo2
        libc.mallopt.argtypes, libc.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    except (OSError, AttributeError):  # not glibc (musl, macOS) or glibc < 2.33
        return None
    return libc


_LIBC = _libc()


def heap_bytes() -> dict[str, int]:
    """{"in_use": bytes allocated (incl. mmapped chunks), "free": bytes held free in the arenas}."""
    if _LIBC is None:
        return {"in_use": 0, "free": 0}
    info = _LIBC.mallinfo2()
    return {"in_use": info.uordblks + info.hblkhd, "free": info.fordblks}


HEAP_BYTES = Gauge("kvmesh_process_heap_bytes", "C heap (glibc malloc) bytes in use and held free", ["state"])
for _state in ("in_use", "free"):
    HEAP_BYTES.labels(_state).set_function(lambda s=_state: heap_bytes()[s])  # read at scrape time


M_TRIM_THRESHOLD = -1  # mallopt's parameter numbers (malloc.h)
M_MMAP_THRESHOLD = -3
TOP_KEPT_BYTES = 64 << 20  # the free top of a heap that a free() leaves in place (M_TRIM_THRESHOLD)


def fix_mmap_threshold(nbytes: int) -> bool:
    """mallopt(M_MMAP_THRESHOLD, nbytes): every allocation of `nbytes` or more gets its own mapping,
    unmapped when freed; 0 leaves glibc's dynamic threshold. True when set.

    NOTE (issue 16, the soak): glibc starts the threshold at 128 KiB and raises it (up to 32 MiB) to
    the size of each mapped chunk freed, so after a prefill worker's first long prompt its
    activations (1-32 MiB, a new size for almost every prompt length) come from the arenas. Freed,
    they stay resident until the next `malloc_trim`: the worker's RSS swung ±60 MiB from sample to
    sample around what it held, and the soak's fitted line read the swings as growth. A fixed
    threshold also switches the dynamic one off (glibc's documented behaviour). Its cost is a
    fresh mapping's page faults per buffer (bench/malloc.py): 1.4x the engine's CPU time at 1 MiB
    (a decode batch's KV gathers are 1-4 MiB), within noise at 4 MiB, the workers' default. The
    buffers below it that still swing are handed back by `trim_heap` every 5 s (`heap_trim_s`; a
    trim of ~350 MiB free takes ~30 ms, on a thread).

    It also fixes the trim threshold at TOP_KEPT_BYTES. NOTE: glibc keeps that one at twice the
    dynamic mmap threshold, and a fixed mmap threshold switches it off too, leaving 128 KiB: then
    every free() of a buffer at the top of a heap gave its pages back, and the next step's buffer
    of the same size faulted them in again. A decode step's KV gathers and attention buffers
    (the tiny model: 1-5 MiB at 8-24 streams of ~1.5k tokens) landed there often: the engine
    process stepped 2-3x slower past ~8k padded KV tokens (tiny, in-process, 24 × 1,568: 11.9 ms
    a step against 7.3 with glibc's defaults and 5.8 with both thresholds fixed), and the
    simulator's calibration fitted that as a context "knee". The periodic trim (`trim_heap`, and
    `start_trim_thread` in an engine process) still hands the kept top back every `heap_trim_s`."""
    if _LIBC is None or nbytes <= 0:
        return False
    return bool(_LIBC.mallopt(M_MMAP_THRESHOLD, nbytes)) and bool(_LIBC.mallopt(M_TRIM_THRESHOLD, TOP_KEPT_BYTES))


def release_free_pages() -> bool:
    """malloc_trim(0): every free page of every arena back to the OS; True when some were."""
    return bool(_LIBC is not None and _LIBC.malloc_trim(0))


async def trim_heap(interval_s: float) -> None:
    """Runs until cancelled: `release_free_pages()` every `interval_s` (0 = never), off the event loop."""
    if _LIBC is None or interval_s <= 0:
        return
    while True:
        await asyncio.sleep(interval_s)
        await asyncio.to_thread(release_free_pages)


def start_trim_thread(interval_s: float, stop: threading.Event | None = None) -> threading.Thread | None:
    """`trim_heap` for a process without an event loop (an engine process, worker/enginehost.py): a
    daemon thread that runs `release_free_pages()` every `interval_s` until `stop` is set; None where it
    would never trim.
    NOTE: the engine's buffers live in the engine process since it has its own, and until this it
    never trimmed: only the workers' main processes did, where the engine used to run as a thread."""
    if _LIBC is None or interval_s <= 0:
        return None

    stopped = stop or threading.Event()

    def trim() -> None:
        while not stopped.wait(interval_s):
            release_free_pages()

    thread = threading.Thread(target=trim, name="heap-trim", daemon=True)
    thread.start()
    return thread
