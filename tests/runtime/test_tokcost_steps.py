"""bench/tokcost.py's step counts: the steps that ran the model, on both sides, not the engine
loop's wake-ups."""

from __future__ import annotations

from kvmesh.engine.llm import EngineConfig, LLMEngine
from kvmesh.engine.sampling import SamplingParams
from tests.scheduler.benchmodule import bench_module

_METRICS = """\
# HELP kvmesh_decode_engine_steps_total engine steps run
kvmesh_decode_engine_steps_total 563.0
kvmesh_decode_model_steps_total{kind="decode"} 554.0
kvmesh_decode_model_steps_total{kind="prefill"} 4.0
kvmesh_decode_stream_frames_total{kind="generate"} 20.0
kvmesh_decode_engine_busy_seconds_total{kind="decode"} 1.5
kvmesh_decode_engine_busy_seconds_total{kind="prefill"} 0.25
"""


def test_a_workers_model_steps_are_counted_apart_from_its_loops_steps() -> None:
    out: dict[str, float] = {}
    bench_module("tokcost").read_counts("decode-0", _METRICS, out)
    assert out == {"decode-0 engine steps": 563.0, "decode-0 model steps": 558.0, "decode-0 generate": 20.0,
                   "decode-0 engine busy s": 1.75}


def test_the_in_process_reference_counts_the_steps_that_ran_the_model() -> None:
    t = bench_module("tokcost")
    engine = LLMEngine(EngineConfig(model="tiny"))
    before, cpu_before = t.model_steps(engine), t.step_cpu_s(engine)
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    tokens, steps = t.closed_loop(engine, [[65, 66, 67], [68, 69], [70], [71, 72]], params, concurrency=2)
    assert tokens == 20
    assert t.model_steps(engine) - before == steps == 10  # two at a time, five steps each (a prefill step gives a token)
    assert t.step_cpu_s(engine) > cpu_before  # the steps' CPU, beside the decode workers' kvmesh_decode_engine_step_cpu_seconds


def test_minor_faults_count_the_fresh_pages_a_process_touches() -> None:
    import mmap

    import psutil

    me, size = psutil.Process(), 16 << 20
    before = bench_module("tokcost")._minor_faults(me)
    with mmap.mmap(-1, size) as fresh:  # NOTE: a mapping of its own: malloc may hand back pages already touched
        for page in range(0, size, 4096):
            fresh[page] = 1
        assert bench_module("tokcost")._minor_faults(me) - before >= 8  # 4 KiB pages, or 2 MiB ones under THP
