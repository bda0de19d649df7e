"""Reading a rollout request: POST /rollout's JSON body and gRPC StartRolloutRequest → RolloutPlan."""

from __future__ import annotations

import json

from kvmesh.runtime.pb import canary_pb2

from .rollout import RolloutPlan

FIELDS = {"steps", "min_samples", "min_seconds", "min_served", "judge_latency"}
EXAMPLE = '{"steps": [0.01, 0.05, 0.25, 0.5, 1.0], "min_samples": 50, "min_seconds": 60}'


def _number(name: str, value: object, integer: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and float(value) != int(value)):
        raise ValueError(f"{name} must be {'an integer' if integer else 'a number'}, got {value!r}")
    return value


def plan_from_json(body: bytes, default_min_samples: int) -> RolloutPlan:
    """ValueError with a message for the operator when the body is not a valid plan."""
    try:
        parsed = json.loads(body or b"null")
    except ValueError:
        raise ValueError(f"the body must be JSON like {EXAMPLE}") from None
    if not isinstance(parsed, dict) or "steps" not in parsed:
        raise ValueError(f"the body must be a JSON object with \"steps\", like {EXAMPLE}")
    if unknown := set(parsed) - FIELDS:
        raise ValueError(f"unknown field(s) {sorted(unknown)}; allowed: {sorted(FIELDS)}")
    steps = parsed["steps"]
    if not isinstance(steps, list):
        raise ValueError(f"steps must be a list of numbers, got {steps!r}")
    judge_latency = parsed.get("judge_latency", False)
    if not isinstance(judge_latency, bool):
        raise ValueError(f"judge_latency must be true or false, got {judge_latency!r}")
    return RolloutPlan(
        tuple(float(_number("a step", w)) for w in steps),
        int(_number("min_samples", parsed.get("min_samples", default_min_samples), integer=True)),
        float(_number("min_seconds", parsed.get("min_seconds", 0.0))),
        int(_number("min_served", parsed.get("min_served", 0), integer=True)),
        judge_latency,
    )


def plan_from_pb(request: canary_pb2.StartRolloutRequest, default_min_samples: int) -> RolloutPlan:
    """proto3 has no "unset": min_samples 0 means the canary's own."""
    return RolloutPlan(tuple(request.steps), request.min_samples or default_min_samples, request.min_seconds,
                       request.min_served, request.judge_latency)
