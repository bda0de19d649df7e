"""The engine's step counters (EngineStats' decode_* and prefill_*) as the decode worker's /metrics
counters: what arrived since the last refresh is added, in seconds where the engine counts µs."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvmesh.decode import metrics
from kvmesh.decode.main import _count_batches
from kvmesh.engine.outputs import EngineStats

IDLE = EngineStats(num_running=0, num_waiting=0, num_free_blocks=8, num_total_blocks=8, prefix_query_tokens=0,
                   prefix_hit_tokens=0, num_preemptions=0, num_prompt_tokens_computed=0, num_generated_tokens=0)


def value(counter, kind: str) -> float:
    return counter.labels(kind)._value.get()


def test_step_wall_and_cpu_time_are_added_since_the_last_refresh_in_seconds() -> None:
    before = {k: (value(metrics.ENGINE_BUSY, k), value(metrics.ENGINE_STEP_CPU, k), value(metrics.MODEL_STEPS, k))
              for k in ("decode", "prefill")}
    first = replace(IDLE, decode_steps=10, decode_step_micros=30_000, decode_step_cpu_micros=20_000,
                    prefill_steps=2, prefill_step_micros=9_000, prefill_step_cpu_micros=8_000)
    seen = _count_batches(first, {})
    later = replace(first, decode_steps=14, decode_step_micros=42_000, decode_step_cpu_micros=26_000)
    _count_batches(later, seen)
    assert value(metrics.MODEL_STEPS, "decode") - before["decode"][2] == 14
    assert value(metrics.ENGINE_BUSY, "decode") - before["decode"][0] == pytest.approx(0.042)
    assert value(metrics.ENGINE_STEP_CPU, "decode") - before["decode"][1] == pytest.approx(0.026)
    assert value(metrics.ENGINE_STEP_CPU, "prefill") - before["prefill"][1] == pytest.approx(0.008)
