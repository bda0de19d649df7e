"""Automatic rollout: a plan of traffic steps, each judged on its own window, advancing on pass and
rolling back on the first failure.

Pure and synchronous. The service applies the weight the rollout wants (`desired_weight`, with
`applied` telling whether the scheduler has it yet), opens a window when a step's weight takes
effect (`begin_step`), feeds that window's figures to `judge`, and persists the rollout (see
`rolloutstore.py`) after every change, so a restarted canary resumes it (`resume`) or rolls it back.

A step below 1.0 is the stepwise split: the candidate serves that share of production traffic
while the canary compares mirrored requests. It holds until its window has `min_samples` compared
replays, `min_served` production requests served by the candidate and `min_seconds` of time, then
passes when no comparable check fails. The last step, 1.0, is the whole promote: it is taken when
the step before it passed, and is not judged (no production traffic is left to compare with).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from .compare import Summary
from .verdict import Check, Thresholds, comparison_checks, served_5xx_check
from .window import ServedCounts

MAX_STEPS = 20


class RolloutState(enum.Enum):
    IDLE = "idle"
    RUNNING = "running"
    COMPLETED = "completed"
    ROLLED_BACK = "rolled_back"
    ABORTED = "aborted"

    @property
    def metric_value(self) -> int:
        """The `kvmesh_canary_rollout_state` gauge: 0 idle, 1 running, 2 completed, 3 rolled back, 4 aborted."""
        return _position(self)


class StepState(enum.Enum):
    PENDING = "pending"
    HOLDING = "holding"
    PASSED = "passed"
    FAILED = "failed"

    @property
    def metric_value(self) -> int:
        """The `kvmesh_canary_rollout_step_verdict` gauge: 0 pending, 1 holding, 2 passed, 3 failed."""
        return _position(self)


def _position(member: enum.Enum) -> int:
    return list(type(member)).index(member)


@dataclass(frozen=True, slots=True)
class RolloutPlan:
    """What `POST /rollout` asks for. `judge_latency` judges latency even when it is not comparable."""

    steps: tuple[float, ...]
    min_samples: int
    min_seconds: float = 0.0
    min_served: int = 0
    judge_latency: bool = False

    def __post_init__(self) -> None:
        steps = self.steps
        if not 2 <= len(steps) <= MAX_STEPS:
            raise ValueError(f"a rollout has 2 to {MAX_STEPS} steps (at least one judged step, then 1.0), got {len(steps)}")
        if any(not 0.0 < w <= 1.0 for w in steps):
            raise ValueError(f"steps are shares of production traffic in (0, 1], got {list(steps)}")
        if any(b <= a for a, b in zip(steps, steps[1:])):
            raise ValueError(f"steps must increase, got {list(steps)}")
        if steps[-1] != 1.0:
            raise ValueError(f"the last step must be 1.0 (the whole promote), got {steps[-1]}")
        if self.min_samples < 1:
            raise ValueError(f"min_samples must be at least 1, got {self.min_samples}")
        if self.min_seconds < 0 or self.min_served < 0:
            raise ValueError("min_seconds and min_served must not be negative")


@dataclass(frozen=True, slots=True)
class StepFigures:
    """What one window measured: its comparison, the noise floor, and served requests by pool."""

    summary: Summary
    noise_floor: float
    noise_samples: int
    served: ServedCounts


@dataclass(slots=True)
class Step:
    weight: float
    state: StepState = StepState.PENDING
    started_at: float = 0.0
    finished_at: float = 0.0
    samples: int = 0
    served: int = 0
    reason: str = ""
    checks: list[Check] = field(default_factory=list)


@dataclass(slots=True)
class Rollout:
    """One rollout. Build with `Rollout.start(plan, now)`."""

    plan: RolloutPlan
    steps: list[Step]
    state: RolloutState = RolloutState.RUNNING
    index: int = 0
    reason: str = ""
    started_at: float = 0.0
    updated_at: float = 0.0
    applied: bool = False  # the scheduler has `desired_weight`
    resumed: int = 0  # canary restarts this rollout went through
    latency_comparable: bool = True

    @classmethod
    def start(cls, plan: RolloutPlan, now: float, latency_comparable: bool = True) -> Rollout:
        return cls(plan, [Step(w) for w in plan.steps], started_at=now, updated_at=now,
                   latency_comparable=latency_comparable or plan.judge_latency)

    @property
    def current(self) -> Step:
        return self.steps[self.index]

    @property
    def desired_weight(self) -> float:
        """The candidate's share of production traffic this rollout wants now."""
        if self.state is RolloutState.RUNNING:
            return self.current.weight
        return 1.0 if self.state is RolloutState.COMPLETED else 0.0

    def begin_step(self, now: float) -> None:
        """The current step's weight took effect: its window starts now."""
        self.applied = True
        if self.state is RolloutState.RUNNING:
            step = self.current
            step.state, step.started_at, step.samples, step.served, step.checks = StepState.HOLDING, now, 0, 0, []
        self.updated_at = now

    def judge(self, figures: StepFigures, thresholds: Thresholds, now: float) -> bool:
        """Judges the current step's window; True when the rollout moved (next step, completed or
        rolled back). While the window is short of its minimums the step holds (figures updated)."""
        step = self.current
        if self.state is not RolloutState.RUNNING or step.state is not StepState.HOLDING:
            return False
        step.samples, step.served = figures.summary.samples, figures.served.candidate
        step.checks = self._checks(figures, thresholds)
        short = self._shortfall(step, now)
        if short:
            step.reason = f"holding: {short}"
            return False
        failed = [check.detail for check in step.checks if check.failed]
        step.finished_at = self.updated_at = now
        if failed:
            step.state, step.reason = StepState.FAILED, "; ".join(failed)
            self._finish(RolloutState.ROLLED_BACK, f"step {self.index + 1} ({step.weight:g}) failed: {step.reason}", now)
            return True
        step.state, step.reason = StepState.PASSED, "passed" + self._not_comparable_note(step)
        self.index += 1
        self.applied = False
        if self.current.weight >= 1.0:
            last = self.current
            last.state, last.started_at, last.finished_at = StepState.PASSED, now, now
            last.reason = "the whole promote: the candidate pool is production"
            self._finish(RolloutState.COMPLETED, "every step passed; promoted to 1.0", now)
        return True

    def abort(self, reason: str, now: float, state: RolloutState = RolloutState.ABORTED) -> None:
        """Stops the rollout and asks for the rollback (the current step, if holding, is left
        unjudged): ABORTED by the operator, or ROLLED_BACK by the canary itself."""
        self._finish(state, reason, now)

    def resume(self, now: float) -> None:
        """After a canary restart: the current step's weight is asserted again and its window
        starts over (the replays it had were in memory); a finished rollout is re-applied."""
        self.resumed += 1
        self.applied = False
        if self.state is RolloutState.RUNNING:
            self.current.state = StepState.PENDING
            self.current.reason = "canary restarted: the step's window starts over"
        self.updated_at = now

    def _finish(self, state: RolloutState, reason: str, now: float) -> None:
        self.state, self.reason, self.updated_at, self.applied = state, reason, now, False

    def _checks(self, figures: StepFigures, thresholds: Thresholds) -> list[Check]:
        checks = comparison_checks(figures.summary, thresholds, figures.noise_floor, self.latency_comparable)
        served = figures.served
        checks.append(served_5xx_check(served.candidate_5xx_rate, served.production_5xx_rate, thresholds))
        return checks

    def _shortfall(self, step: Step, now: float) -> str:
        plan, missing = self.plan, []
        if step.samples < plan.min_samples:
            missing.append(f"{step.samples}/{plan.min_samples} samples")
        if step.served < plan.min_served:
            missing.append(f"{step.served}/{plan.min_served} served by the candidate")
        if now - step.started_at < plan.min_seconds:
            missing.append(f"{now - step.started_at:.0f}/{plan.min_seconds:g} s")
        return ", ".join(missing)

    def _not_comparable_note(self, step: Step) -> str:
        if any(not check.comparable for check in step.checks):
            return " (latency not comparable: the candidate runs at reduced CPU priority; not judged)"
        return ""
