"""run_service: the tasks a service leaves behind get a bounded time to end once cancelled."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

SERVICE = textwrap.dedent("""
    import asyncio, logging, sys
    from kvmesh.runtime.process import run_service

    async def stubborn():
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                pass  # a bug: it never ends

    async def polite():
        await asyncio.sleep(3600)

    async def main(kind):
        asyncio.ensure_future(stubborn() if kind == "stubborn" else polite())
        await asyncio.sleep(0)
        return 0

    logging.basicConfig(level=logging.INFO)
    sys.exit(run_service(main(sys.argv[1]), leftover_s=0.5))
""")


def run(kind: str) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", SERVICE, kind], capture_output=True, text=True, timeout=60)
    return done, time.monotonic() - started


def test_a_task_that_ignores_its_cancel_is_logged_and_the_process_exits_anyway() -> None:
    done, took = run("stubborn")
    assert done.returncode == 1 and took < 20
    assert "task Task-2 did not end" in done.stderr and "stubborn" in done.stderr


def test_tasks_that_end_when_cancelled_end_the_service_as_before() -> None:
    done, _ = run("polite")
    assert done.returncode == 0 and "did not end" not in done.stderr
