"""The C heap: freed pages in the middle of an arena go back to the OS when trimmed (glibc)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvmesh.runtime import heap

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
