"""The engine's step counters (EngineStats' decode_* and prefill_*; engine/batchstats.py): steps
by kind, their decode rows, the KV tokens their decode attention read padded to the longest row,
their wall time and their CPU time."""

from __future__ import annotations

import time
from pathlib import Path

from kvmesh.engine.llm import EngineConfig, LLMEngine
from kvmesh.engine.sampling import SamplingParams

PARAMS = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


def test_a_batch_of_two_counts_one_prefill_step_and_seven_decode_steps_padded_to_the_longer_row(tiny_dir: Path) -> None:
    engine = LLMEngine(EngineConfig(model=str(tiny_dir), num_kv_blocks=64))
    engine.generate([[1, 2, 3] * 10, [4, 5] * 40], PARAMS)  # 30 and 80 prompt tokens
    s = engine.stats()
    assert (s.prefill_steps, s.prefill_step_rows, s.prefill_step_padded_kv_tokens) == (1, 0, 0)
    assert (s.decode_steps, s.decode_step_rows) == (7, 14)
    # the k-th decode step reads the 80-token row's context, 80 + k, for both rows
    assert s.decode_step_padded_kv_tokens == 2 * sum(80 + k for k in range(1, 8))
    assert s.decode_step_micros > 0 and s.prefill_step_micros > 0


def test_rows_decoding_beside_a_prefill_count_as_riding_along_with_it(tiny_dir: Path) -> None:
    engine = LLMEngine(EngineConfig(model=str(tiny_dir), num_kv_blocks=64))
    engine.add_request("a", [7] * 20, PARAMS)
    engine.step()  # a's prefill
    engine.step()  # a's first decode step: context 21
    engine.add_request("b", [9] * 40, PARAMS)
    engine.step()  # b's prefill, a's second decode row (context 22) riding along
    s = engine.stats()
    assert (s.prefill_steps, s.prefill_step_rows, s.prefill_step_padded_kv_tokens) == (2, 1, 22)
    assert (s.decode_steps, s.decode_step_rows, s.decode_step_padded_kv_tokens) == (1, 1, 21)


def test_step_cpu_counts_the_stepping_threads_cpu_not_its_waits(tiny_dir: Path) -> None:
    engine = LLMEngine(EngineConfig(model=str(tiny_dir), num_kv_blocks=64))
    execute = engine.runner.execute

    def slow_execute(*args, **kwargs):  # a step that waits (as on a host that took the CPU away)
        time.sleep(0.05)
        return execute(*args, **kwargs)

    engine.runner.execute = slow_execute
    engine.generate([[7] * 20], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    s = engine.stats()
    assert s.prefill_step_micros >= 50_000 and s.decode_step_micros >= 50_000
    assert 0 < s.prefill_step_cpu_micros < 50_000 and 0 < s.decode_step_cpu_micros < 50_000


def test_time_between_steps_counts_only_while_sequences_are_unfinished(tiny_dir: Path) -> None:
    engine = LLMEngine(EngineConfig(model=str(tiny_dir), num_kv_blocks=64))
    engine.add_request("a", [7] * 20, SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    engine.step()  # prefill and first token: a still has a token to go
    time.sleep(0.05)
    engine.step()  # its last token
    held = engine.stats().between_steps_micros
    assert held >= 50_000
    time.sleep(0.05)  # nothing unfinished: not counted
    engine.add_request("b", [9] * 20, SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
    engine.step()
    assert engine.stats().between_steps_micros == held


def test_the_first_token_carries_the_requests_wait_in_the_engine_and_its_prefill_once(tiny_dir: Path) -> None:
    engine = LLMEngine(EngineConfig(model=str(tiny_dir), num_kv_blocks=64))
    engine.add_request("a", [7] * 20, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    time.sleep(0.05)  # added, not stepped yet: waiting in the engine
    [first] = engine.step()
    assert first.new_token_ids and first.queue_s >= 0.05 and 0 < first.prefill_s < 5
    [second] = engine.step()
    assert second.queue_s is None and second.prefill_s is None
