"""Plumbing shared by the prefill and decode workers: the engine thread (settings: settings.py).

The engine is not thread-safe, so one `EngineLoop` thread owns it: it runs queued commands
between steps and calls `engine.step()` while there is work. The asyncio side submits commands
with `await loop.call(fn)`, or by name, `await loop.call("cached_prefix_blocks", tokens)` (bounded
by `call_timeout_s`; named commands: `commands.py`, all that the engine process of
`engineproc.py` takes), and receives each request's outputs through an `OutputStream` or a
`deliver` callback, all of one step's outputs in one hand-over to the event loop. `progress`
counts the steps that advanced a request and `progress_at` says when the last one did (the
watchdog and the heartbeat read them); `stats` reads the engine's counts at the moment it is
read, from any thread (see `EngineLoop.stats`); a step that advanced nothing (e.g. a prefill
worker whose blocks are all held by requests waiting for release) makes the thread wait for the
next command instead of spinning with the GIL held.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from kvmesh.runtime.errors import Unavailable
from kvmesh.runtime.process import name_os_thread

from .commands import BASE_COMMANDS, Command
from .settings import step_pause_s
from .delivery import OutputStream, call_each, claim
from .outputhold import OutputHold

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(slots=True)
class _Subscription:
    deliver: Callable[[Any], None]  # runs on the event loop
    on_output: Callable[[Any, Any], Any] | None  # runs on the engine thread


class EngineLoop:
    """One thread that owns the engine; see the module docstring.

    NOTE: a step's outputs cross to the event loop in ONE `call_soon_threadsafe`, whatever the
    batch size; each request's consumer (`deliver`) then runs on the event loop. Per-request
    cross-thread calls per step cost more than the model step itself on a small model.
    """

    def __init__(
        self,
        engine: Any,
        name: str = "engine",
        step_delay_s: float = 0.0,
        step_slowdown: float = 1.0,
        clock: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], None] = time.sleep,
        call_timeout_s: float = 60.0,
        idle_wait_s: float = 0.05,
        commands: Mapping[str, Command] = BASE_COMMANDS,
        hold: OutputHold | None = None,
    ) -> None:
        self.engine = engine
        self.hold = hold or OutputHold()
        self.commands = commands
        self.call_timeout_s = call_timeout_s
        self.idle_wait_s = idle_wait_s
        self.step_delay_s = step_delay_s
        self.step_slowdown = step_slowdown
        self._clock = clock
        self._sleep = sleep
        self.step_hooks: list[Callable[[Any, list[Any]], None]] = []  # run on the engine thread after each step
        self._loop: asyncio.AbstractEventLoop | None = None
        self._commands: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._subs: dict[str, _Subscription] = {}
        self._held: list[Callable[[], Any]] | None = None  # deliveries held while a batch of commands runs
        self.num_steps = 0
        self.progress = 0  # steps that advanced a request
        self.progress_at = time.monotonic()  # when one last did (or the engine last had nothing to do)
        self.has_work = False  # as of the engine thread's last look
        self._stalled_step = False  # the last step advanced nothing
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    @property
    def stats(self) -> Any:
        """The engine's stats (queue depth, running, free blocks, counters) as they are now.

        NOTE: read from the event loop while the engine thread may be mid-step, without a lock or
        a round trip through the engine thread (which a stuck step would block): `engine.stats()`
        is only `len()`s of the scheduler's queues and the free-block map plus int counters, each
        one atomic under the GIL. The counts may straddle a request moving between queues in the
        step under way, never torn values. A copy cached after each step (as before) showed a
        stuck step's requests as never started and a burst of adds only after the next step.
        """
        return self.engine.stats()

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread.start()

    async def stop(self) -> None:
        self._commands.put(None)
        await asyncio.to_thread(self._thread.join, 10.0)
        log.info("engine loop stopped after %d steps", self.num_steps)

    def _bind(self, fn: Callable[..., T] | str, args: tuple) -> Callable[[Any], T]:
        command = self.commands[fn] if isinstance(fn, str) else fn
        return (lambda engine: command(engine, *args)) if args else command

    async def call(self, fn: Callable[..., T] | str, *args: Any, timeout_s: float | None = None) -> T:
        """Run `fn(engine, *args)` (`fn` a callable or the name of a command) on the engine thread
        between steps; its result or exception comes back. Raises Unavailable when the engine
        thread does not answer within `timeout_s` (default `call_timeout_s`): a stuck engine fails
        its callers instead of hanging them."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        fn = self._bind(fn, args)

        def run() -> None:
            try:
                result = fn(self.engine)
            except Exception as exc:  # noqa: BLE001 - handed to the caller
                self._deliver(lambda e=exc: future.done() or future.set_exception(e))
            else:
                self._deliver(lambda: future.done() or future.set_result(result))

        self._commands.put(run)
        wait_s = self.call_timeout_s if timeout_s is None else timeout_s
        try:
            return await asyncio.wait_for(future, wait_s)
        except TimeoutError:
            raise Unavailable(f"the engine did not answer within {wait_s:g} s") from None

    def call_nowait(self, fn: Callable[..., Any] | str, *args: Any) -> None:
        """Fire-and-forget `fn(engine, *args)` on the engine thread (errors are logged)."""
        fn = self._bind(fn, args)

        def run() -> None:
            try:
                fn(self.engine)
            except Exception:  # noqa: BLE001 - nobody waits for it
                log.exception("engine command failed")

        self._commands.put(run)

    async def add_request(
        self,
        request_id: str,
        add: Callable[[Any], None],
        on_output: Callable[[Any, Any], Any] | None = None,
        deliver: Callable[[Any], None] | None = None,
    ) -> OutputStream | None:
        """`add(engine)` then stream the request's outputs. `on_output(engine, output)` (on the
        engine thread, right after the step) turns each output into the item delivered.
        `deliver(item)` (on the event loop) receives each item, or an exception when the engine
        failed; without it the items go to the returned OutputStream."""
        stream = OutputStream() if deliver is None else None
        sub = _Subscription(deliver or stream.put, on_output)

        def run(engine: Any) -> None:
            add(engine)
            self._subs[request_id] = sub

        await self.call(run)
        return stream

    async def offload(self, command: str, *args: Any) -> Any:
        """A named command that is safe beside a step (a grammar compile, a copy of pinned blocks),
        on a worker thread: the engine thread keeps stepping."""
        return await asyncio.to_thread(self.commands[command], self.engine, *args)

    async def start_request(self, request_id: str, deliver: Callable[[Any], None], command: str, *args: Any) -> Any:
        """Run the named command that adds `request_id` to the engine; its outputs (or an engine
        failure) then go to `deliver` on the event loop. Returns the command's result."""
        sub, add = _Subscription(deliver, None), self.commands[command]

        def run(engine: Any) -> Any:
            result = add(engine, *args)
            self._subs[request_id] = sub
            return result

        return await self.call(run)

    def cancel(self, request_id: str) -> None:
        """Abort the request in the engine and stop delivering its outputs."""

        def run(engine: Any) -> None:
            self._subs.pop(request_id, None)
            engine.abort_request(request_id)

        self.call_nowait(run)

    def post(self, fn: Callable[[], Any]) -> None:
        """From the engine thread (e.g. a step hook): run `fn()` on the event loop."""
        self._deliver(fn)

    def _deliver(self, fn: Callable[[], Any]) -> None:
        if self._held is not None:
            self._held.append(fn)
            return
        try:
            self._loop.call_soon_threadsafe(fn)
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            pass

    def _run_commands(self, commands: list[Callable[[], None]]) -> None:
        """Run a batch of commands; their results cross to the event loop in ONE
        `call_soon_threadsafe` (a burst of arriving requests is one wake-up of the loop, not one each)."""
        self._held = held = []
        try:
            for command in commands:
                command()
        finally:
            self._held = None
            if len(held) == 1:
                self._deliver(held[0])
            elif held:
                self._deliver(lambda: call_each(((fn, ()) for fn in held), "delivering an engine result"))

    def _run(self) -> None:
        name_os_thread(self._thread.name)
        while True:
            busy = self.has_work = self.engine.has_unfinished_requests()
            if not busy:
                self.progress_at = time.monotonic()  # NOTE: nothing to do is not a stall
            commands = []
            try:
                if not busy:
                    commands.append(self._commands.get())
                elif self._stalled_step:  # NOTE: nothing can move until a command (release, abort) comes
                    commands.append(self._commands.get(timeout=self.idle_wait_s))
                else:
                    commands.append(self._commands.get_nowait())
                while True:
                    commands.append(self._commands.get_nowait())
            except queue.Empty:
                pass
            stop = None in commands
            if stop:
                commands = commands[: commands.index(None)]
            self._run_commands(commands)
            if stop:
                return
            if busy or commands:
                self._step()

    def _step(self) -> None:
        self.num_steps += 1
        started = self._clock()
        self._step_once()
        delay = step_pause_s(self.step_delay_s, self.step_slowdown, self._clock() - started)
        if delay > 0:
            self._sleep(delay)

    def _step_once(self) -> None:
        try:
            outputs, made = self.hold.step(self.engine, self.num_steps, time.monotonic)
        except Exception as exc:  # noqa: BLE001 - fail the requests, keep the worker alive
            log.exception("engine step failed; failing %d requests", len(self._subs))
            failed = [(sub.deliver, exc) for sub in self._subs.values()]
            for request_id in list(self._subs):
                self.engine.abort_request(request_id)
            self._subs.clear()
            self.hold.reset()
            self._deliver(lambda: call_each(((d, (exc,)) for d, exc in failed), "delivering an engine failure"))
            self._stalled_step = False
            return
        self._stalled_step = not made
        if made:
            self.progress += 1
            self.progress_at = time.monotonic()
        items: list[tuple[Callable[[Any], None], Any]] = []
        for out in outputs:
            sub = claim(self._subs, out)
            if sub is None:
                continue
            try:
                item = sub.on_output(self.engine, out) if sub.on_output else out
            except Exception as exc:  # noqa: BLE001 - handed to the request's consumer
                item = exc
            items.append((sub.deliver, item))
        if items:
            self._deliver(lambda: call_each(((d, (item,)) for d, item in items), "delivering an engine output"))
        call_each(((hook, (self.engine, outputs)) for hook in self.step_hooks), "engine step hook")
