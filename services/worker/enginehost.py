"""The engine process: builds the engine from the worker's settings and steps it (child side).

Started by `engineproc.EngineProcess.spawn` as `python -m <role's host module> --fd N` (e.g.
`kvmesh.decode.enginehost`), never by forking the worker. It talks to the worker over the
socket `N` only (frames: `enginewire`), on its main thread: it runs the commands that arrived,
steps the engine while it has work, and sends at most ONE `step` frame per step with every due
output (under load the tokens leave every `stream_interval` steps, or sooner once they waited
`stream_interval_ms`: `outputhold.py`), the stats, the step and progress counts and the KV cache
events. A step with nothing due sends none, unless `quiet_s` passed since the last frame (the
worker's stats and the watchdog's progress): QUIET_S, or twice the hold's time bound if that is
longer, so that a hold never goes out just after a frame of stats alone (with the 20 ms it had,
every hold of steps of 2.9 ms or more was preceded by one: nearly twice the frames). KV cache
events wait for the next frame: they are not due on their own (the worker publishes them at most
every 20 ms anyway), and at 32 running requests some block fills on nearly every step.
Commands marked off-loop (a grammar compile, a copy of pinned blocks) run on a side thread and
answer when done.

It exits when the worker says `stop`, when the socket reaches EOF (the worker died), or, on
Linux, with SIGKILL when its parent dies (PR_SET_PDEATHSIG). SIGINT/SIGTERM are ignored: a
Ctrl-C or a supervisor's signal to the process group must not kill the engine under a worker
that is draining; the worker stops it.
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import select
import signal
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kvmesh.runtime.heap import fix_mmap_threshold, start_trim_thread
from kvmesh.runtime.process import apply_cpus, name_os_thread

from . import enginewire as wire
from .commands import Command
from .outputhold import OutputHold
from .settings import WorkerSettings, bound_cpu_kernel_caches, engine_config, step_pause_s

log = logging.getLogger(__name__)


IOV_MAX = 1024  # buffers one sendmsg takes (Linux)
QUIET_S = 0.05  # the longest a busy engine goes without a frame, at least (`quiet_for`)


def send_all(sock: socket.socket, parts: list[wire.Buffer]) -> None:
    """`sendall` of the parts concatenated, with `sendmsg` (no joined copy): resumes after a partial send."""
    views = [memoryview(p).cast("B") for p in parts if len(p)]
    first = 0
    while first < len(views):
        sent = sock.sendmsg(views[first:first + IOV_MAX])
        while sent and first < len(views):
            n = views[first].nbytes
            if sent >= n:
                sent -= n
                first += 1
            else:
                views[first] = views[first][sent:]
                sent = 0


class FrameSocket:
    """Blocking frames over a stream socket; `send` is safe from several threads."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._buf = bytearray()
        self._send_lock = threading.Lock()

    def send(self, frames: list[bytes | list[wire.Buffer]]) -> None:
        """Sends frames (each one bytes, or its parts: `wire.frame_parts`) in order, in one gathered
        write: a large blob goes from its own memory to the socket, not through a joined copy."""
        parts = [part for f in frames for part in ((f,) if isinstance(f, bytes) else f)]
        with self._send_lock:
            if len(parts) == 1:
                self.sock.sendall(parts[0])
            else:
                send_all(self.sock, parts)

    def poll(self, timeout: float | None) -> list[tuple[dict, bytearray]]:
        """Complete frames that arrived within `timeout` (None = wait for one); EOFError at EOF."""
        ready, _, _ = select.select([self.sock], [], [], timeout)
        while ready:
            try:
                chunk = self.sock.recv(1 << 20, socket.MSG_DONTWAIT)
            except BlockingIOError:
                break
            if not chunk:
                raise EOFError("the worker closed the engine socket")
            self._buf += chunk
        frames, taken = wire.take_frames(self._buf, len(self._buf))
        del self._buf[:taken]
        return frames

    def recv(self) -> tuple[dict, bytearray]:
        while not (frames := self.poll(None)):
            pass
        return frames[0]


class EngineHost:
    """The step loop of the engine process; see the module docstring."""

    def __init__(self, engine: Any, conn: FrameSocket, commands: Mapping[str, Command], step_delay_s: float = 0.0,
                 step_slowdown: float = 1.0, idle_wait_s: float = 0.05, hold: OutputHold | None = None,
                 quiet_s: float = QUIET_S) -> None:
        self.engine = engine
        self.conn = conn
        self.commands = commands
        self.step_delay_s = step_delay_s
        self.step_slowdown = step_slowdown
        self.idle_wait_s = idle_wait_s
        self.progress = 0
        self.steps = 0
        self.hold = hold or OutputHold()
        self.quiet_s = quiet_s  # the longest a busy engine goes without a step frame (stats, progress)
        self._last_frame = 0.0
        self._last_w = False
        self._events = hasattr(engine, "take_kv_events")
        self._pending_events: list = []  # KV cache events of steps that sent no frame, in order
        self._side = ThreadPoolExecutor(2, thread_name_prefix="engine-side")
        self._stalled = False

    def run(self) -> None:
        name_os_thread("engine")
        try:
            while True:
                busy = self.engine.has_unfinished_requests()
                timeout = None if not busy else self.idle_wait_s if self._stalled else 0.0
                frames = self.conn.poll(timeout)
                replies, stop = self._run_commands(frames)
                if busy or frames:
                    step = self._step()
                    if step is not None:
                        replies.append(step)
                if replies:
                    self.conn.send(replies)
                if stop:
                    return
        except (EOFError, BrokenPipeError, ConnectionResetError):
            log.info("the worker is gone; the engine process exits")
        finally:
            self._side.shutdown(wait=False, cancel_futures=True)

    def _run_commands(self, frames: list[tuple[dict, bytearray]]) -> tuple[list[bytes | list[wire.Buffer]], bool]:
        replies: list[bytes | list[wire.Buffer]] = []
        for header, blobs in frames:
            if header["k"] == "stop":
                return replies, True
            if header.get("t"):
                self._side.submit(self._answer_off_loop, header, blobs)
            else:
                replies.append(self._answer(header, blobs))
        return replies, False

    def _answer(self, header: dict, blobs: bytearray) -> list[wire.Buffer]:
        """The reply frame's parts: a result's tensors (a hand-back's KV blocks) are sent from their own memory."""
        try:
            result = self.commands[header["n"]](self.engine, *wire.unpack(header["a"], blobs))
            out: list[wire.Buffer] = []
            return wire.frame_parts({"k": "reply", "i": header["i"], "v": wire.pack(result, out)}, out)
        except Exception as exc:  # noqa: BLE001 - handed to the caller
            return wire.frame({"k": "reply", "i": header["i"], "x": wire.error_to_wire(exc)})

    def _answer_off_loop(self, header: dict, blobs: bytearray) -> None:
        try:
            self.conn.send([self._answer(header, blobs)])
        except OSError:
            pass  # the worker is gone; the step loop sees it too

    def _step(self) -> bytes | None:
        """One engine step; its frame, or None when it has nothing due: its outputs all held (see
        `OutputHold`), no error, the same `w`, and a frame went out within `quiet_s`. KV events wait for
        the next frame, or go at once when the engine has nothing left to run. The engine's stats are
        read only for a frame that goes."""
        started = time.perf_counter()
        header: dict[str, Any] = {"k": "step"}
        self.steps += 1
        made = False
        try:
            outputs, made = self.hold.step(self.engine, self.steps, time.monotonic)
        except Exception as exc:  # noqa: BLE001 - the worker fails the requests; this process lives on
            log.exception("engine step failed")
            header["x"] = wire.error_to_wire(exc)
            outputs = []
            self.hold.reset()
        self._stalled = not made and "x" not in header
        if made:
            self.progress += 1
        working = self.engine.has_unfinished_requests()
        if self._events:
            self._pending_events += self.engine.take_kv_events()
        delay = step_pause_s(self.step_delay_s, self.step_slowdown, time.perf_counter() - started)
        if delay > 0:
            time.sleep(delay)
        now = time.monotonic()
        if not (outputs or "x" in header or working != self._last_w or now - self._last_frame >= self.quiet_s
                or (self._pending_events and not working)):  # NOTE: an idle engine sends no later frame
            return None
        self._last_frame, self._last_w = now, working
        header["o"] = [wire.output_to_wire(o) for o in outputs]
        header["s"] = wire.stats_to_wire(self.engine.stats())
        header["p"] = self.progress
        header["n"] = self.steps
        header["w"] = working
        if self._pending_events:
            header["e"] = wire.events_to_wire(self._pending_events)
            self._pending_events = []
        return wire.frame(header)


def quiet_for(hold: OutputHold, floor_s: float = QUIET_S) -> float:
    """The longest a busy engine goes without a frame: past the hold's time bound, so a hold is
    never preceded by a frame of stats alone (see the module docstring)."""
    return max(floor_s, 2 * hold.max_hold_s)


def die_with_parent() -> None:
    """SIGKILL this process when its parent dies (Linux); exit now if it already has."""
    parent = os.getppid()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent or parent == 1:
        os._exit(1)


def main(settings_cls: type[WorkerSettings], commands: Mapping[str, Command], argv: Sequence[str] | None = None) -> int:
    """The engine process's entry point (a role's `python -m ...enginehost`)."""
    args = argparse.ArgumentParser(description="kvmesh engine process (started by a worker)")
    args.add_argument("--fd", type=int, required=True, help="the socket to the worker")
    fd = args.parse_args(argv).fd
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    conn = FrameSocket(socket.socket(fileno=fd))
    hello, _ = conn.recv()
    settings = settings_cls(**hello["settings"])
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s[engine]: %(message)s")
    fix_mmap_threshold(settings.malloc_mmap_threshold_kib * 1024)
    start_trim_thread(settings.heap_trim_s)
    bound_cpu_kernel_caches(settings.cpu_kernel_cache_entries)
    try:
        apply_cpus(settings.engine_cpus)  # NOTE: before torch starts its threads, which inherit it
        from kvmesh.engine.llm import LLMEngine  # noqa: PLC0415

        engine = LLMEngine(engine_config(settings))
    except Exception as exc:  # noqa: BLE001 - the worker reports it and exits
        log.exception("building the engine failed")
        conn.send([wire.frame({"k": "fail", "x": wire.error_to_wire(exc)})])
        return 1
    conn.send([wire.frame({
        "k": "ready", "block_size": engine.block_size, "max_model_len": engine.max_model_len,
        "model_id": engine.hasher.model_id, "dtype": engine.hasher.dtype, "pid": os.getpid(),
        "s": wire.stats_to_wire(engine.stats()),
    })])
    hold = OutputHold.from_settings(settings)
    EngineHost(engine, conn, commands, settings.step_delay_s, settings.step_slowdown, hold=hold,
               quiet_s=quiet_for(hold)).run()
    return 0
