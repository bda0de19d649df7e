"""The async shell around a `Rollout`: applies the weight it wants through the scheduler, judges
the current step every `tick_s`, keeps it in its file, and picks it up again after a restart."""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from kvmesh.runtime.errors import FailedPrecondition, MeshError

from .rollout import Rollout, RolloutPlan, RolloutState, StepFigures
from .rolloutstore import RolloutStore, idle_json, rollout_to_json
from .state import CanaryState
from .verdict import Thresholds

log = logging.getLogger(__name__)


class OnRestart(enum.Enum):
    """What a restarted canary does with a rollout that was running."""

    RESUME = "resume"
    ROLLBACK = "rollback"


class RolloutDriver:
    """`switch(weight)` moves the candidate's share of production traffic (0 = rollback, 1 = the
    whole promote) and raises MeshError when the scheduler refuses."""

    def __init__(
        self,
        state: CanaryState,
        store: RolloutStore,
        switch: Callable[[float], Awaitable[object]],
        thresholds: Thresholds,
        latency_comparable: bool = True,
        on_restart: OnRestart = OnRestart.RESUME,
        tick_s: float = 0.5,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._state = state
        self._store = store
        self._switch = switch
        self._thresholds = thresholds
        self._latency_comparable = latency_comparable
        self._on_restart = on_restart
        self._tick_s = tick_s
        self._clock = clock
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self.rollout: Rollout | None = None
        self.unusable = ""  # why the saved rollout could not be read (then the canary rolls back)
        self._unusable_rolled_back = False

    @property
    def running(self) -> bool:
        return self.rollout is not None and self.rollout.state is RolloutState.RUNNING

    @property
    def state(self) -> RolloutState:
        if self.rollout is not None:
            return self.rollout.state
        return RolloutState.ROLLED_BACK if self.unusable else RolloutState.IDLE

    def status(self) -> dict[str, Any]:
        """GET /rollout's body."""
        if self.rollout is not None:
            return rollout_to_json(self.rollout)
        return {**idle_json(), "state": self.state.value, "reason": self.unusable}

    def recover(self) -> None:
        """Reads the saved rollout at start: a running one resumes (or rolls back, as configured),
        a finished one whose switch never reached the scheduler is switched again, an unusable
        file is set aside and production rolled back."""
        now = self._clock()
        try:
            rollout = self._store.load()
        except ValueError as exc:
            aside = self._store.set_aside()
            self.unusable = f"{exc}; set aside as {aside}; rolled back"
            log.error("rollout: %s", self.unusable)
            return
        if rollout is None:
            return
        if rollout.state is RolloutState.RUNNING and self._on_restart is OnRestart.ROLLBACK:
            rollout.abort("the canary restarted mid-rollout (rollout_on_restart=rollback)", now, RolloutState.ROLLED_BACK)
            rollout.resumed += 1
        elif rollout.state is RolloutState.RUNNING or not rollout.applied:
            rollout.resume(now)
        self.rollout = rollout
        self._store.save(rollout)
        log.info("rollout: picked up %s at step %d after a restart", rollout.state.value, rollout.index + 1)

    async def start(self, plan: RolloutPlan) -> dict[str, Any]:
        """Starts a rollout at its first step; FailedPrecondition when one is running or the
        candidate is already production, MeshError when the scheduler refuses the first step."""
        async with self._lock:
            if self.running:
                raise FailedPrecondition("a rollout is running; DELETE /rollout (or AbortRollout) stops it")
            if self._state.pools != self._state.configured:
                raise FailedPrecondition(
                    f"pool {self._state.pools.production!r} is production after a whole promote: roll back first"
                )
            rollout = self.rollout = Rollout.start(plan, self._clock(), self._latency_comparable)
            self._store.save(rollout)  # NOTE: before the switch, so a crash in between is resumed, not lost
            try:
                await self._apply(rollout)
            except MeshError as exc:
                rollout.abort(f"the first step was refused: {exc}", self._clock(), RolloutState.ROLLED_BACK)
                self._store.save(rollout)
                raise
            log.info("rollout: started, steps %s", list(plan.steps))
            return rollout_to_json(rollout)

    async def abort(self, reason: str = "aborted by the operator") -> dict[str, Any]:
        """Stops the running rollout and rolls back; FailedPrecondition when none is running."""
        async with self._lock:
            if self.rollout is None or not self.running:
                raise FailedPrecondition("no rollout is running")
            self.rollout.abort(reason, self._clock())
            self._store.save(self.rollout)
            await self._apply(self.rollout)
            return rollout_to_json(self.rollout)

    def begin(self) -> None:
        self._task = asyncio.create_task(self._run(), name="canary-rollout")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        while True:
            try:
                await self.tick()
            except MeshError as exc:
                log.warning("rollout: %s (trying again in %.1f s)", exc, self._tick_s)
            await asyncio.sleep(self._tick_s)

    async def tick(self) -> None:
        """Applies what is pending, judges the current step, and applies again if it moved."""
        async with self._lock:
            rollout = self.rollout
            if rollout is None:
                if self.unusable and not self._unusable_rolled_back:
                    await self._switch(0.0)
                    self._unusable_rolled_back = True
                return
            if not rollout.applied:
                await self._apply(rollout)
            if rollout.state is RolloutState.RUNNING and rollout.judge(self._figures(), self._thresholds, self._clock()):
                log.info("rollout: %s at step %d: %s", rollout.state.value, rollout.index + 1,
                         rollout.reason or rollout.steps[rollout.index - 1].reason)
                self._store.save(rollout)
                await self._apply(rollout)

    async def _apply(self, rollout: Rollout) -> None:
        await self._switch(rollout.desired_weight)
        self._state.open_window()
        rollout.begin_step(self._clock())
        self._store.save(rollout)

    def _figures(self) -> StepFigures:
        window = self._state.window
        floor, samples = self._state.noise_floor()
        return StepFigures(window.comparison.summary(), floor, samples, window.served)
