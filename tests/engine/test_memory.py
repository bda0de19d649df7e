"""KV cache sizing from free device memory (faked figures) and the max_model_len that follows."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import pytest

from kvmesh.engine.llm import EngineConfig, LLMEngine
from kvmesh.engine.memory import MemoryProfile, kv_bytes_from_profile, plan_kv_cache
from kvmesh.engine.sampling import SamplingParams

GIB = 1 << 30
MIB = 1 << 20
TINY_BLOCK_BYTES = 2 * 2 * 16 * 2 * 16 * 4  # K and V, 2 layers, 16 tokens, 2 kv heads x 16 dims, fp32 = 8 KiB


@dataclass
class FakeMemory:
    free: int
    total: int
    held: int = 100 * MIB  # weights etc., held after profiling
    activation: int = 50 * MIB  # the profiling pass's peak above `held`
    resets: int = 0

    def mem_get_info(self) -> tuple[int, int]:
        return self.free, self.total

    def reset_peak(self) -> None:
        self.resets += 1

    def peak_allocated(self) -> int:
        return self.held + self.activation

    def allocated(self) -> int:
        return self.held


def test_kv_bytes_leave_room_for_everything_in_use_and_the_activation_peak() -> None:
    profile = MemoryProfile(total=80 * GIB, free=60 * GIB, activation_peak=2 * GIB)
    assert kv_bytes_from_profile(profile, 0.9) == int(80 * GIB * 0.9) - 20 * GIB - 2 * GIB
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        kv_bytes_from_profile(profile, 1.5)


def test_plan_keeps_the_model_length_when_one_sequence_fits() -> None:
    plan = plan_kv_cache(1000 * 4096, 4096, 16, model_max_len=8192, requested_max_len=None)
    assert (plan.num_blocks, plan.max_model_len, plan.lowered_from) == (1000, 8192, None)
    assert plan_kv_cache(1000 * 4096, 4096, 16, 8192, 4000).max_model_len == 4000
    assert plan_kv_cache(1000 * 4096, 4096, 16, 8192, 10000).max_model_len == 8192  # never above the checkpoint's


def test_plan_lowers_max_model_len_only_when_one_sequence_cannot_fit_and_logs_it(caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="kvmesh.engine.memory"):
        plan = plan_kv_cache(128 * 4096, 4096, 16, model_max_len=8192, requested_max_len=None)
    assert (plan.num_blocks, plan.max_model_len, plan.lowered_from) == (128, 2048, 8192)
    assert "max_model_len lowered from 8192 to 2048" in caplog.text


def test_plan_refuses_a_budget_below_one_block() -> None:
    with pytest.raises(MemoryError, match="no room for the KV cache"):
        plan_kv_cache(4095, 4096, 16, 8192, None)


def test_engine_sizes_its_cache_from_free_memory(tiny_dir: Path) -> None:
    memory = FakeMemory(free=(1 * GIB) - 300 * MIB, total=1 * GIB)
    engine = LLMEngine(EngineConfig(model=str(tiny_dir), gpu_memory_utilization=0.5), memory=memory)
    kv_bytes = int(GIB * 0.5) - 300 * MIB - 50 * MIB
    assert memory.resets == 1
    assert engine.block_manager.num_blocks == kv_bytes // TINY_BLOCK_BYTES
    assert engine.max_model_len == 2048  # the checkpoint's max_position_embeddings, which fits


def test_engine_lowers_max_model_len_when_free_memory_is_short(tiny_dir: Path, caplog) -> None:
    in_use = int(GIB * 0.9) - MIB - 100 * TINY_BLOCK_BYTES - 5  # leaves room for 100 blocks and change
    memory = FakeMemory(free=GIB - in_use, total=GIB, activation=MIB)
    with caplog.at_level(logging.WARNING, logger="kvmesh.engine.memory"):
        engine = LLMEngine(EngineConfig(model=str(tiny_dir)), memory=memory)
    blocks = 100
    assert (engine.block_manager.num_blocks, engine.max_model_len) == (blocks, blocks * 16)
    assert f"max_model_len lowered from 2048 to {blocks * 16}" in caplog.text
    out = engine.generate([[256, 1, 2, 3]], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))[0]
    assert len(out.token_ids) == 4


def test_cpu_keeps_the_byte_budget(tiny_dir: Path) -> None:
    engine = LLMEngine(EngineConfig(model=str(tiny_dir), kv_cache_memory_bytes=64 * TINY_BLOCK_BYTES))
    assert (engine.block_manager.num_blocks, engine.max_model_len) == (64, 1024)
