"""The worker's side of an engine in its own process (setting `engine_process`; child: `enginehost.py`).

`EngineProcess` keeps `EngineLoop`'s surface (`call`, `call_nowait`, `offload`, `start_request`,
`cancel`, `post`, `stats`, `progress`, `progress_at`, `has_work`, `step_hooks`, `start`, `stop`)
but commands go by name (`commands.py`): a closure cannot cross a process. The child sends one
`step` frame per engine step; its outputs are dispatched to each request's `deliver` on the event
loop, its KV events reach the step hooks through `engine.take_kv_events()`, and its stats and
progress count become this object's. `engine` is an `EngineInfo`: what the worker reads of the
engine without asking it (block size, context length, hasher, model args).

NOTE: why a process (issue 13): an engine thread in the worker shares the GIL with gRPC and
asyncio, and torch releases and re-takes it on every op; a decode step then cost ~80 µs of CPU per
output token in the worker against ~53 µs alone.

A child that dies, or closes its socket, fails every pending command and every request in
flight with UNAVAILABLE and leaves `has_work` set with `progress_at` at -inf, so the watchdog
deregisters the worker at its next check: a dead engine never leaves a worker that looks healthy.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvmesh.runtime.blockhash import BlockHasher
from kvmesh.runtime.errors import Unavailable

from . import enginewire as wire
from .delivery import call_each, claim
from .framereceiver import FrameReceiver
from .settings import WorkerSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class EngineLimits:
    max_num_seqs: int


@dataclass(slots=True)
class EngineInfo:
    """What a worker reads of its engine without a round trip; `take_kv_events` hands the step
    hooks the KV events of the step being dispatched."""

    block_size: int
    max_model_len: int
    hasher: BlockHasher
    model_args: Any  # kvmesh.engine.config.ModelArgs
    config: EngineLimits
    pid: int = 0
    kv_events: list = field(default_factory=list)

    def take_kv_events(self) -> list[tuple[str, list[bytes], bytes | None]]:
        events, self.kv_events = self.kv_events, []
        return events


class EngineProcess:
    """The engine in a child process; see the module docstring. Build it with `spawn`."""

    def __init__(self, proc: asyncio.subprocess.Process, reader: FrameReceiver, writer: asyncio.Transport,
                 info: EngineInfo, stats: Any, call_timeout_s: float = 60.0) -> None:
        self.engine = info
        self.call_timeout_s = call_timeout_s
        self.step_hooks: list[Callable[[Any, list[Any]], None]] = []  # run on the event loop after each step frame
        self.num_steps = 0
        self.progress = 0
        self.progress_at = 0.0
        self.has_work = False
        self.dead: str | None = None  # why the engine process is gone
        self._proc = proc
        self._reader = reader
        self._writer = writer
        self._stats = stats
        self._ids = itertools.count()
        self._pending: dict[int, asyncio.Future] = {}
        self._subs: dict[str, Callable[[Any], None]] = {}
        self._task: asyncio.Task | None = None
        self._stopping = False

    @classmethod
    async def spawn(cls, host_module: str, settings: WorkerSettings) -> EngineProcess:
        """Starts `python -m host_module` (a role's `enginehost`) and waits until its engine is built."""
        from kvmesh.engine.config import ModelArgs  # noqa: PLC0415 - torch-free model metadata
        from kvmesh.engine.tiny import resolve_model  # noqa: PLC0415

        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", host_module, "--fd", str(theirs.fileno()), pass_fds=(theirs.fileno(),))
        finally:
            theirs.close()
        writer, reader = await asyncio.get_running_loop().create_unix_connection(FrameReceiver, sock=ours)
        writer.write(wire.frame({"k": "hello", "settings": settings.model_dump(mode="json")}))
        try:
            ready, _ = await reader.read()
        except asyncio.IncompleteReadError:
            code = await proc.wait()
            raise RuntimeError(f"the engine process exited ({code}) before its engine was built") from None
        if ready["k"] != "ready":
            await proc.wait()
            raise RuntimeError(f"the engine process failed to build its engine: {ready['x'][1]}")
        hasher = BlockHasher(ready["model_id"], ready["dtype"], ready["block_size"])
        info = EngineInfo(ready["block_size"], ready["max_model_len"], hasher,
                          ModelArgs.from_dir(resolve_model(settings.model)), EngineLimits(settings.max_num_seqs),
                          ready["pid"])
        log.info("engine process %d ready", ready["pid"])
        return cls(proc, reader, writer, info, wire.stats_from_wire(ready["s"]), settings.engine_call_timeout_s)

    @property
    def stats(self) -> Any:
        """The engine's stats as of its last step frame (EngineStats)."""
        return self._stats

    @property
    def pid(self) -> int:
        return self._proc.pid

    def start(self) -> None:
        self.progress_at = time.monotonic()
        self._task = asyncio.create_task(self._read(), name="engine-process-reader")

    async def stop(self) -> None:
        self._stopping = True
        if self.dead is None:
            self._send({"k": "stop"})
        try:
            await asyncio.wait_for(self._proc.wait(), 10.0)
        except TimeoutError:
            log.warning("the engine process did not stop; killing it")
            self._proc.kill()
            await self._proc.wait()
        if self._task is not None:
            self._task.cancel()
        self._writer.close()
        log.info("engine process stopped after %d steps", self.num_steps)

    async def call(self, command: str, *args: Any, timeout_s: float | None = None) -> Any:
        """Run the named command between steps in the engine process; its result or its error
        (ValueError or RuntimeError) comes back. Unavailable when the process does not answer
        within `timeout_s` (default `call_timeout_s`) or is gone."""
        return await self._call(command, args, False, timeout_s)

    async def offload(self, command: str, *args: Any) -> Any:
        """Like `call`, but the engine process runs it beside its step loop (on a side thread)."""
        return await self._call(command, args, True, None)

    def call_nowait(self, command: str, *args: Any) -> None:
        """Fire-and-forget a named command (errors are logged by nobody: use for aborts, unpins)."""
        if self.dead is None:
            self._send_command(next(self._ids), command, args, False)

    async def start_request(self, request_id: str, deliver: Callable[[Any], None], command: str, *args: Any) -> Any:
        """Run the named command that adds `request_id` to the engine; its outputs (or the
        engine's failure) then go to `deliver` on the event loop. Returns the command's result."""
        self._subs[request_id] = deliver  # NOTE: no output of it can come before the command's reply
        if not self.has_work:
            # NOTE: idle time is not a stall. An idle child sends no step frames, so progress_at is
            # the last frame's; without this, the watchdog's first look after a long idle, before the
            # new request's first frame, found "work pending, no progress for 70 s" and deregistered.
            self.progress_at = time.monotonic()
        self.has_work = True  # NOTE: a step that hangs from here on is a stall, even if the engine was idle
        try:
            return await self.call(command, *args)
        except BaseException:
            if self._subs.get(request_id) is deliver:
                del self._subs[request_id]
            raise

    def cancel(self, request_id: str) -> None:
        """Stop delivering the request's outputs and abort it in the engine."""
        self._subs.pop(request_id, None)
        self.call_nowait("abort_request", request_id)

    def post(self, fn: Callable[[], Any]) -> None:
        """Run `fn()` on the event loop (the step hooks already run there)."""
        asyncio.get_running_loop().call_soon(fn)

    # -- the wire --------------------------------------------------------------------------
    async def _call(self, command: str, args: tuple, off_loop: bool, timeout_s: float | None) -> Any:
        if self.dead is not None:
            raise Unavailable(f"the engine is gone: {self.dead}")
        if callable(command):
            raise TypeError("the engine runs in its own process: call a named command (kvmesh.worker.commands)")
        call_id = next(self._ids)
        future = self._pending[call_id] = asyncio.get_running_loop().create_future()
        self._send_command(call_id, command, args, off_loop)
        wait_s = self.call_timeout_s if timeout_s is None else timeout_s
        try:
            return await asyncio.wait_for(future, wait_s)
        except TimeoutError:
            raise Unavailable(f"the engine did not answer within {wait_s:g} s") from None
        finally:
            self._pending.pop(call_id, None)

    def _send_command(self, call_id: int, command: str, args: tuple, off_loop: bool) -> None:
        blobs: list[bytes] = []
        header = {"k": "cmd", "i": call_id, "n": command, "a": wire.pack(list(args), blobs)}
        if off_loop:
            header["t"] = 1
        self._send(header, blobs)

    def _send(self, header: dict, blobs: list[bytes] = ()) -> None:
        try:
            self._writer.write(wire.frame(header, blobs))
        except (ConnectionError, RuntimeError) as exc:  # NOTE: the reader sees the EOF and fails everything
            log.debug("engine socket write failed: %s", exc)

    async def _read(self) -> None:
        try:
            while True:
                header, blobs = await self._reader.read()
                if header["k"] == "step":
                    self._on_step(header)
                elif header["k"] == "reply":
                    self._on_reply(header, blobs)
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            if not self._stopping:
                await self._on_dead(f"its socket closed ({type(exc).__name__})")
        except Exception as exc:  # noqa: BLE001 - a frame this side cannot read: the engine is unusable
            log.exception("bad frame from the engine process")
            self._proc.kill()
            await self._on_dead(f"bad frame: {exc}")

    def _on_reply(self, header: dict, blobs: wire.Blobs) -> None:
        future = self._pending.get(header["i"])
        if future is None or future.done():
            return
        if "x" in header:
            future.set_exception(wire.error_from_wire(header["x"]))
        else:
            future.set_result(wire.unpack(header["v"], blobs))

    def _on_step(self, header: dict) -> None:
        self.num_steps = header["n"]  # the host counts every step, those that sent no frame too
        self._stats = wire.stats_from_wire(header["s"])
        self.has_work = header["w"]
        if header["p"] != self.progress or not self.has_work:
            self.progress = header["p"]
            self.progress_at = time.monotonic()
        if "x" in header:
            self._fail_all(wire.error_from_wire(header["x"]), abort=True)
        outputs = [wire.output_from_wire(w) for w in header["o"]]
        call_each(((deliver, (out,)) for out in outputs if (deliver := claim(self._subs, out)) is not None),
                  "delivering an engine output")
        if "e" in header and self.step_hooks:
            self.engine.kv_events = wire.events_from_wire(header["e"])
        call_each(((hook, (self.engine, outputs)) for hook in self.step_hooks), "engine step hook")
        self.engine.kv_events = []

    def _fail_all(self, exc: Exception, abort: bool) -> None:
        subs, self._subs = self._subs, {}
        log.error("failing %d requests: %s", len(subs), exc)
        for request_id, deliver in subs.items():
            if abort:
                self.call_nowait("abort_request", request_id)
            try:
                deliver(exc)
            except Exception:  # noqa: BLE001
                log.exception("delivering an engine failure failed")

    async def _on_dead(self, why: str) -> None:
        try:
            code = await asyncio.wait_for(self._proc.wait(), 5.0)
        except TimeoutError:
            code = None
        self.dead = f"the engine process {self._proc.pid} exited ({code}): {why}"
        log.error("%s; this worker cannot serve any more", self.dead)
        self.has_work, self.progress_at = True, float("-inf")  # NOTE: the watchdog deregisters at its next look
        error = Unavailable(self.dead)
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(error)
        self._fail_all(error, abort=False)

