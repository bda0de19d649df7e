"""CPU priority: every thread of the process, and threads started later, run at the priority named.
Each case runs in a child process: lowering a priority cannot be undone without privileges."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from pydantic import ValidationError

from kvmesh.runtime.config import MeshSettings, settings_from_argv

CHILD = """
import json, os, threading
from pathlib import Path
from kvmesh.runtime.process import apply_cpu_priority

before = threading.Event(); release = threading.Event()
early = threading.Thread(target=lambda: (before.set(), release.wait()))
early.start(); before.wait()
apply_cpu_priority(PRIORITY)
late = threading.Thread(target=release.wait)
late.start()

def state(tid):
    return [os.sched_getscheduler(tid) == os.SCHED_IDLE, os.getpriority(os.PRIO_PROCESS, tid)]

print(json.dumps([state(int(t.name)) for t in Path("/proc/self/task").iterdir()]))
release.set(); early.join(); late.join()
"""


def thread_states(priority: str) -> list[list]:
    out = subprocess.run([sys.executable, "-c", CHILD.replace("PRIORITY", repr(priority))],
                         capture_output=True, text=True, timeout=60, check=True)
    return json.loads(out.stdout)


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE") or not os.path.isdir("/proc/self/task"), reason="Linux only")
@pytest.mark.parametrize(("priority", "expected"), [("normal", [False, 0]), ("low", [False, 10]), ("idle", [True, 19])])
def test_every_thread_now_and_later_gets_the_priority(priority, expected):
    if os.getpriority(os.PRIO_PROCESS, 0) != 0:
        pytest.skip("the test runner itself is niced")
    states = thread_states(priority)
    assert len(states) == 3  # main, a thread started before, one started after
    assert states == [expected] * 3


def test_the_setting_accepts_only_the_named_priorities(monkeypatch):
    assert MeshSettings().cpu_priority == "normal"
    monkeypatch.setenv("KVMESH_CPU_PRIORITY", "idle")
    assert MeshSettings().cpu_priority == "idle"
    monkeypatch.setenv("KVMESH_CPU_PRIORITY", "realtime")
    with pytest.raises(ValidationError):
        MeshSettings()
    monkeypatch.delenv("KVMESH_CPU_PRIORITY")
    assert settings_from_argv(MeshSettings, ["--cpu-priority", "low"], "t").cpu_priority == "low"
    with pytest.raises(SystemExit):
        settings_from_argv(MeshSettings, ["--cpu-priority", "realtime"], "t")


def test_run_service_runs_the_coroutine_on_uvloop():
    import asyncio

    import uvloop

    from kvmesh.runtime.process import run_service

    async def main() -> str:
        await asyncio.sleep(0)
        return type(asyncio.get_running_loop()).__module__

    assert run_service(main()) == uvloop.Loop.__module__


def test_a_named_thread_shows_its_name_in_the_os() -> None:
    """bench/tokcost.py finds a worker's engine thread by the name the OS has for it."""
    import threading
    from pathlib import Path

    from kvmesh.runtime.process import name_os_thread

    seen: list[str] = []

    def run() -> None:
        name_os_thread("decode-engine-and-more")
        seen.append(Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text().strip())

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert seen == ["decode-engine-a"]  # the kernel keeps 15 bytes


def test_objects_alive_at_startup_are_frozen_out_of_the_collector_once() -> None:
    """A full collection must not walk the model and the modules again (a ~100 ms stop of every
    thread in a decode worker); the freeze happens once, at the first call."""
    import gc
    import subprocess
    import sys

    code = (
        "import gc\n"
        "from kvmesh.runtime.process import freeze_startup_objects\n"
        "startup = [[i] for i in range(50_000)]\n"
        "assert gc.get_freeze_count() == 0\n"
        "freeze_startup_objects()\n"
        "frozen = gc.get_freeze_count()\n"
        "assert frozen >= 50_000, frozen\n"
        "later = [[i] for i in range(1000)]\n"
        "freeze_startup_objects()\n"
        "assert gc.get_freeze_count() == frozen\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    assert gc.isenabled()
