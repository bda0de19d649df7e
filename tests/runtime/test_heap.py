"""The C heap: freed pages in the middle of an arena go back to the OS when trimmed (glibc)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kvmesh.runtime import heap
from kvmesh.runtime.config import MeshSettings

pytestmark = pytest.mark.skipif(heap._LIBC is None, reason="glibc's malloc_trim/mallinfo2 only")  # noqa: SLF001


def rss_mib() -> float:
    return int(Path("/proc/self/status").read_text().split("VmRSS:")[1].split()[0]) / 1024


def test_freed_pages_below_live_blocks_are_returned_only_by_a_trim() -> None:
    """Issue 16 (soak): what malloc keeps after frees in the middle of its heap is RSS until trimmed."""
    blocks = [bytes(64 * 1024) for _ in range(1024)]  # 64 MiB below the mmap threshold: heap pages
    del blocks[:-1]  # NOTE: the last one stays, so the freed pages are not at the heap's top
    held = rss_mib()
    assert heap.heap_bytes()["free"] >= 48 * 1024 * 1024
    assert heap.release_free_pages()
    assert rss_mib() < held - 40


# NOTE: each script runs in a fresh interpreter (`_run`): a heap's thresholds are process-wide
LIBC_PRELUDE = """
import ctypes, sys
from kvmesh.runtime.heap import _LIBC as libc, M_MMAP_THRESHOLD, fix_mmap_threshold
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
from kvmesh.runtime.config import MeshSettings
threshold = MeshSettings.model_fields["malloc_mmap_threshold_kib"].default * 1024  # the workers' default
"""

MAPPED_GROWTH = LIBC_PRELUDE + """
libc.free(libc.malloc(16 << 20))  # a freed mapped chunk: glibc raises its dynamic threshold to 16 MiB
if sys.argv[1] == "fixed":
    assert fix_mmap_threshold(threshold)
before = libc.mallinfo2().hblkhd
buffer = libc.malloc(threshold + (1 << 20))  # like a prefill activation: a new size per prompt length
print(libc.mallinfo2().hblkhd - before)
libc.free(buffer)
"""


def _run(script: str, mode: str) -> int:
    """`script` in a fresh interpreter with `mode` as its argument; the integer it prints."""
    out = subprocess.run([sys.executable, "-c", script, mode], check=True, capture_output=True, text=True)
    return int(out.stdout)


def test_a_fixed_mmap_threshold_maps_large_buffers_so_a_free_returns_them() -> None:
    """Issue 16 (soak): after one large free glibc serves buffers of up to 32 MiB from its arenas,
    where they stay resident once freed (the prefill worker's RSS swings); with the workers' fixed
    threshold each one above it gets its own mapping, unmapped by its free."""
    assert _run(MAPPED_GROWTH, "dynamic") == 0
    assert _run(MAPPED_GROWTH, "fixed") >= 5 << 20


TOP_KEPT = LIBC_PRELUDE + """
if sys.argv[1] == "fixed":
    assert fix_mmap_threshold(threshold)
else:  # the mmap threshold alone, as before
    assert libc.mallopt(M_MMAP_THRESHOLD, threshold)
buffer = libc.malloc(threshold // 2)  # like a decode step's KV gather: below the threshold, at the heap's top
libc.free(buffer)
print(libc.mallinfo2().keepcost)  # the free top of the heap, still mapped
"""


def test_a_fixed_mmap_threshold_keeps_the_freed_top_of_the_heap_for_the_next_step() -> None:
    """A fixed mmap threshold also pins glibc's trim threshold at 128 KiB, so each free of a buffer at
    the heap's top gave its pages back and the next step faulted them in again (the engine stepped
    2-3x slower at long contexts); `fix_mmap_threshold` keeps up to TOP_KEPT_BYTES of it in place."""
    half = MeshSettings.model_fields["malloc_mmap_threshold_kib"].default * 1024 // 2  # the buffer freed
    assert _run(TOP_KEPT, "mmap-only") < half
    assert _run(TOP_KEPT, "fixed") >= half


def test_a_trim_thread_hands_free_pages_back_on_its_own_and_none_starts_for_never(monkeypatch) -> None:
    """An engine process has no event loop: its trims run on a thread (heap.start_trim_thread)."""
    calls = threading.Semaphore(0)
    monkeypatch.setattr(heap, "release_free_pages", lambda: calls.release() or True)
    assert heap.start_trim_thread(0) is None
    stop = threading.Event()
    thread = heap.start_trim_thread(0.02, stop)
    assert thread is not None and thread.daemon
    try:
        deadline = time.monotonic() + 5
        for _ in range(2):
            assert calls.acquire(timeout=max(0.0, deadline - time.monotonic()))
    finally:
        stop.set()
        thread.join(timeout=5)
    assert not thread.is_alive()
