"""Holds requests' new tokens where the engine steps, so that under load they leave together.

Under load (at least `hold_from` requests in the engine) a decode worker sends its requests'
tokens every `interval` engine steps, all of them on the same step (`stream_interval`,
docs/token-stream.md), and sooner when the oldest of them has waited `max_hold_s`
(`stream_interval_ms`): what a client waits for a token is bounded in time too, however long an
engine step takes (a large model's 30 ms steps would otherwise hold a token 8 x 30 ms). Both
count from the step the hold began (its first held token), not from step numbers that are
multiples of `interval`: with those, a hold that the time bound let go a step or two before such a
step was followed by one of a step or two on it. Steps of 20/6-20/4 ms (`tiny` at 64 requests on
two CPUs) then sent 32-33 frames and SSE chunks a request per 128 tokens instead of 20-25. A
request's first output (it may carry prompt logprobs and the time to its first token) and its end
go at once, the step they are made. Below that load every output goes the step it is made.

Why in the engine process and not in the worker's stream (where it was): there, every engine step
still carried every running request's token to the worker's event loop, which woke, decoded and
filed each one to hold it. Held where they are made, an engine process sends no step frame at all
on the steps that have nothing due (`EngineHost`), so its worker's RPC process wakes once per
`interval` steps (plus the steps with a first token or an end), and one `StepOutput` to the
gateway carries every request's tokens. Both engine loops (`EngineHost`, `EngineLoop`) hold the
same way.

Where the tokens wait: in the engine's own per-request state (`LLMEngine.step(hold=True)` makes no
output for a request that sent one before; `take_held` makes one, of everything since). An output
object a request a step, merged into the one held, cost ~2.5 µs a token (`tiny`'s engine at 32
requests, timed in place: 1.6 µs building them, 1 µs merging them and the per-step stats the hold
read). This class is the policy: whether a step holds, and when what is held goes. Pure but for
`step`, which runs it on an engine; the caller passes the clock.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvmesh.engine.outputs import RequestOutput


class OutputHold:
    """When requests' new tokens wait in the engine and when they go; see the module docstring."""

    __slots__ = ("interval", "hold_from", "max_hold_s", "_since", "_from")

    def __init__(self, interval: int = 1, hold_from: int = 1, max_hold_s: float = 0.0) -> None:
        self.interval = max(1, interval)
        self.hold_from = max(1, hold_from)
        self.max_hold_s = max_hold_s  # 0: no time bound
        self._since = 0.0  # when the hold began (the clock `due` is given)
        self._from = 0  # the step it began on (0: no hold)

    @classmethod
    def from_settings(cls, settings: object) -> OutputHold:
        """A role's hold: its `stream_interval`, `stream_interval_from` and `stream_interval_ms` (a
        decode worker's), else none."""
        return cls(getattr(settings, "stream_interval", 1), getattr(settings, "stream_interval_from", 1),
                   getattr(settings, "stream_interval_ms", 0.0) / 1000)

    def holds(self, in_engine: int) -> bool:
        """Whether a step with `in_engine` requests (running and waiting) holds its tokens."""
        return self.interval > 1 and in_engine >= self.hold_from

    def due(self, held: int, holds: bool, step: int, now: float) -> bool:
        """Whether the tokens held now go, after step number `step` (`now`: a monotonic clock in
        seconds); `held`: the requests holding some; `holds`: whether this step held. Below the
        load (`holds` False) they go at once; under it on the hold's `interval`-th step, counted
        from the step it began, or once it is `max_hold_s` old."""
        if not held:
            self._from = 0
            return False
        if holds and not self._from:
            self._from, self._since = step, now
        if not holds or step - self._from + 1 >= self.interval or 0 < self.max_hold_s <= now - self._since:
            self._from = 0
            return True
        return False

    def reset(self) -> None:
        """Forget the hold (the engine failed a step: the worker fails its requests)."""
        self._from = 0

    def step(self, engine: Any, step: int, clock: Callable[[], float]) -> tuple[list[RequestOutput], bool]:
        """One step of `engine` (an `LLMEngine`) under this hold: (what goes out now, whether the
        step made anything: outputs, or tokens it held). Without an interval the engine steps plainly."""
        if self.interval == 1:
            outputs = engine.step()
            return outputs, bool(outputs)
        holds = self.holds(engine.num_unfinished_requests())
        outputs = engine.step(hold=holds)
        made = bool(outputs) or engine.last_step_ran
        if self.due(engine.num_held, holds, step, clock()):
            outputs += engine.take_held()
        return outputs, made
