"""A rollout as JSON (the REST body of GET /rollout, and what survives a canary restart) and the
file it is kept in: written to a temporary file and renamed, so a crash never leaves half a file."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .rollout import Rollout, RolloutPlan, RolloutState, Step, StepState
from .verdict import Check

FORMAT_VERSION = 1


def check_to_json(check: Check) -> dict[str, Any]:
    return {"name": check.name, "value": check.value, "limit": check.limit, "passed": check.passed,
            "comparable": check.comparable, "detail": check.detail}


def step_to_json(step: Step) -> dict[str, Any]:
    return {"weight": step.weight, "state": step.state.value, "started_at": step.started_at,
            "finished_at": step.finished_at, "samples": step.samples, "served": step.served,
            "reason": step.reason, "checks": [check_to_json(c) for c in step.checks]}


def rollout_to_json(rollout: Rollout) -> dict[str, Any]:
    """Field names follow kvmesh.v1.RolloutStatus; `step` counts from 1."""
    p = rollout.plan
    return {
        "state": rollout.state.value, "step": rollout.index + 1, "weight": rollout.desired_weight,
        "reason": rollout.reason, "applied": rollout.applied, "resumed": rollout.resumed,
        "latency_comparable": rollout.latency_comparable,
        "started_at": rollout.started_at, "updated_at": rollout.updated_at,
        "min_samples": p.min_samples, "min_seconds": p.min_seconds, "min_served": p.min_served,
        "judge_latency": p.judge_latency, "steps": [step_to_json(s) for s in rollout.steps],
    }


def idle_json() -> dict[str, Any]:
    """GET /rollout before any rollout."""
    return {"state": RolloutState.IDLE.value, "step": 0, "weight": 0.0, "reason": "", "steps": []}


def rollout_from_json(data: dict[str, Any]) -> Rollout:
    """The inverse of `rollout_to_json`; KeyError/ValueError/TypeError on a malformed document."""
    plan = RolloutPlan(tuple(float(w) for w in data["steps_plan"]), int(data["min_samples"]),
                       float(data["min_seconds"]), int(data["min_served"]), bool(data["judge_latency"]))
    steps = [
        Step(float(s["weight"]), StepState(s["state"]), float(s["started_at"]), float(s["finished_at"]),
             int(s["samples"]), int(s["served"]), str(s["reason"]),
             [Check(str(c["name"]), float(c["value"]), float(c["limit"]), bool(c["passed"]), str(c["detail"]),
                    bool(c["comparable"])) for c in s["checks"]])
        for s in data["steps"]
    ]
    if [s.weight for s in steps] != list(plan.steps):
        raise ValueError("the steps do not match the plan")
    index = int(data["step"]) - 1
    if not 0 <= index < len(steps):
        raise ValueError(f"step {index + 1} is out of range")
    return Rollout(plan, steps, RolloutState(data["state"]), index, str(data["reason"]), float(data["started_at"]),
                   float(data["updated_at"]), bool(data["applied"]), int(data["resumed"]),
                   bool(data["latency_comparable"]))


class RolloutStore:
    """The rollout's file (`path`); an empty path keeps nothing (the rollout dies with the canary)."""

    def __init__(self, path: str) -> None:
        self.path = Path(path) if path else None

    def load(self) -> Rollout | None:
        """The saved rollout, None when there is none; ValueError when the file is unusable."""
        if self.path is None or not self.path.exists():
            return None
        try:
            data = json.loads(self.path.read_text())
            if data.get("version") != FORMAT_VERSION:
                raise ValueError(f"format version {data.get('version')!r}, expected {FORMAT_VERSION}")
            return rollout_from_json(data)
        except (OSError, KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"rollout state {self.path} is unusable: {exc!r}") from None

    def save(self, rollout: Rollout) -> None:
        if self.path is None:
            return
        data = {"version": FORMAT_VERSION, "steps_plan": list(rollout.plan.steps), **rollout_to_json(rollout)}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        with tmp.open("w") as f:
            json.dump(data, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def set_aside(self) -> Path | None:
        """Renames an unusable file to `<name>.unusable` (kept for a human) and returns the new path."""
        if self.path is None or not self.path.exists():
            return None
        aside = self.path.with_name(self.path.name + ".unusable")
        os.replace(self.path, aside)
        return aside
