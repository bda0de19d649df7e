"""What every service process does first: logging, its OS CPU priority, and the CPUs it runs on.

The priority lets a canary's candidate pool share a host with production without taking CPU from it:

- `normal`: leave the process as it is.
- `low`: nice 10 - it still gets a small share of a busy CPU.
- `idle`: Linux SCHED_IDLE - it runs only on CPU time nobody else wants (nice 19 elsewhere).

Priorities are per thread on Linux, so every thread that exists now is changed, and threads
started later inherit the setting from the thread that starts them.

The CPUs (`cpus`, e.g. "0" or "0-3,8"; `kvmesh up --pin-engines` sets them) pin the process and
every thread of it, as `taskset` would, so a worker's engine can have CPUs no other process
context-switches onto.
"""

from __future__ import annotations

import asyncio
import gc
import io
import logging
import os
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from .config import MeshSettings

log = logging.getLogger(__name__)

CpuPriority = Literal["normal", "low", "idle"]
LOW_NICE = 10
IDLE_NICE = 19


def _thread_ids() -> list[int]:
    tasks = Path("/proc/self/task")
    if not tasks.is_dir():
        return [0]
    return [int(t.name) for t in tasks.iterdir()]


def _on_every_thread(action: Callable[[int], None], what: str) -> None:
    """`action(tid)` for each thread this process has now; where it fails (a thread that just
    ended, no permission) the thread is logged and skipped."""
    for tid in _thread_ids():
        try:
            action(tid)
        except OSError as exc:
            log.warning("could not %s thread %d: %s", what, tid, exc)


def _lower_nice(tid: int, nice: int) -> None:
    # NOTE: only ever lowers priority, which needs no privilege.
    current = os.getpriority(os.PRIO_PROCESS, tid)
    if current < nice:
        os.setpriority(os.PRIO_PROCESS, tid, nice)


def apply_cpu_priority(priority: CpuPriority) -> None:
    """Lowers this process's CPU priority (every thread) as named; `normal` changes nothing."""
    if priority == "normal":
        return
    idle = priority == "idle" and hasattr(os, "SCHED_IDLE")
    nice = IDLE_NICE if priority == "idle" else LOW_NICE

    def lower(tid: int) -> None:
        if idle:
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        _lower_nice(tid, nice)

    _on_every_thread(lower, "lower the CPU priority of")
    log.info("CPU priority: %s", priority)


def parse_cpu_list(text: str) -> frozenset[int]:
    """"0-2,5" → {0, 1, 2, 5}; "" → {} (any CPU). ValueError on anything else."""
    cpus: set[int] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        first, dash, last = part.partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            raise ValueError(f"bad CPU list {text!r}: expected numbers and ranges such as 0-3,8")
        low, high = int(first), int(last) if dash else int(first)
        if high < low:
            raise ValueError(f"bad CPU list {text!r}: the range {part} runs backwards")
        cpus.update(range(low, high + 1))
    return frozenset(cpus)


def format_cpu_list(cpus: list[int] | frozenset[int]) -> str:
    """[0, 1, 2, 5] → "0-2,5" (what parse_cpu_list reads back)."""
    parts: list[str] = []
    for cpu in sorted(cpus):
        if parts and cpu == int(parts[-1].rpartition("-")[2]) + 1:
            parts[-1] = f"{parts[-1].partition('-')[0]}-{cpu}"
        else:
            parts.append(str(cpu))
    return ",".join(parts)


def apply_cpus(text: str) -> None:
    """Runs this process, every thread it has and every one it starts, on the CPUs listed (Linux;
    "" changes nothing). A list with no CPU the OS lets it use fails the start with ValueError.

    NOTE: not narrowed to the CPUs it runs on now: an engine process starts on its worker's CPUs
    and moves to CPUs of its own."""
    cpus = parse_cpu_list(text)
    if not cpus:
        return
    if not hasattr(os, "sched_setaffinity"):
        log.warning("CPU list %r ignored: this OS cannot pin a process", text)
        return
    try:
        os.sched_setaffinity(0, cpus)
    except OSError as exc:
        raise ValueError(f"CPU list {text!r}: this process may not run there ({exc.strerror})") from None
    _on_every_thread(lambda tid: os.sched_setaffinity(tid, cpus), f"pin to CPUs {text}")
    log.info("CPUs: %s", format_cpu_list(os.sched_getaffinity(0)))


def init_process(settings: MeshSettings) -> None:
    """Logging at the settings' level, then the settings' CPU priority and CPUs."""
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    apply_cpu_priority(settings.cpu_priority)
    apply_cpus(settings.cpus)


LEFTOVER_S = 5.0  # how long the tasks a service left running get to end once cancelled


def run_service(main: Coroutine[Any, Any, Any], leftover_s: float = LEFTOVER_S) -> Any:
    """`asyncio.run(main)` on uvloop when it is installed (a runtime dependency; every service's
    event loop runs on it: its I/O and callbacks cost a fraction of the pure-Python loop's), except
    that the tasks still running when `main` ends get `leftover_s` to end once cancelled.

    NOTE: asyncio.run waits for them without a bound. A scheduler stopped as its NATS server died
    (the launcher killed: every child gets SIGTERM at once) sat in that wait for over 30 minutes, a
    task of it never ending after its cancel. Past the bound each such task's stack is logged and
    the process exits (status 1) without them."""
    try:
        import uvloop  # noqa: PLC0415

        factory: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
    except ImportError:  # pragma: no cover - uvloop is a dependency; a bare install still runs
        factory = None
    runner = asyncio.Runner(loop_factory=factory)
    try:
        return runner.run(main)
    finally:
        if not _end_leftover_tasks(runner.get_loop(), leftover_s):
            logging.shutdown()
            os._exit(1)
        runner.close()


def _end_leftover_tasks(loop: asyncio.AbstractEventLoop, timeout_s: float) -> bool:
    """Cancels the loop's unfinished tasks and runs it until they end, `timeout_s` at most; False
    (their stacks logged) when some did not."""
    left = [task for task in asyncio.all_tasks(loop) if not task.done()]
    if not left:
        return True
    for task in left:
        task.cancel()
    _, pending = loop.run_until_complete(asyncio.wait(left, timeout=timeout_s))
    for task in pending:
        stack = io.StringIO()
        task.print_stack(file=stack)
        log.error("task %s did not end %.0f s after its cancel; exiting without it:\n%s", task.get_name(), timeout_s,
                  stack.getvalue())
    return not pending


def name_os_thread(name: str) -> None:
    """Give the calling thread `name` (15 bytes at most) in the OS as well, so `top -H`, py-spy and
    /proc/PID/task/TID/comm (which bench/tokcost.py reads) tell it apart. Linux only; a no-op elsewhere."""
    import ctypes  # noqa: PLC0415

    try:
        ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


_frozen = False


def freeze_startup_objects() -> None:
    """Once a service is up: collect, then move every object alive now (modules, the model, the
    tokenizer, settings) out of the cyclic garbage collector's reach (`gc.freeze`). A full
    collection otherwise walks all of them again: ~100 ms in a decode worker (270,000 objects),
    with the GIL held, so its engine thread and every stream stop meanwhile. The first call only.
    """
    global _frozen
    if _frozen:
        return
    _frozen = True
    gc.collect()
    gc.freeze()
