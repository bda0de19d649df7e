"""`kvmesh sim replay` and `kvmesh sim calibrate` against a real mesh (`kvmesh up --decode 1 --prefill 0`,
the tiny model): shared hash ids become real prefix-cache hits, and the calibration prints flags."""

import asyncio
import math
import random

import pytest

from kvmesh.runtime.launcher import MeshOptions, free_port
from kvmesh.runtime.supervisor import Mesh
from kvmesh.scheduler.sim import sim_main
from kvmesh.scheduler.sim.client import Target, new_client, served_model, stream_one
from kvmesh.scheduler.sim.hostspeed import SpeedConfig, measure
from kvmesh.scheduler.sim.meshprobe import ProbeConfig, probe
from kvmesh.scheduler.sim.replay import ReplayConfig, replay, sent_late
from kvmesh.scheduler.sim.trace import TraceRequest, write_jsonl

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    mesh = Mesh(MeshOptions(model="tiny", port=free_port(), run_dir=str(tmp_path_factory.mktemp("mesh")),
                            prefill=0, decode=1, kvstore=False))
    mesh.start(timeout_s=180)
    try:
        yield mesh.gateway_url
    finally:
        mesh.stop()


def test_a_replayed_trace_hits_the_cache_where_its_hash_ids_are_shared(gateway):
    system = tuple(range(100, 108))  # 8 shared blocks = 128 tokens
    trace = [
        TraceRequest(0.0, "a", "s1", 140, 4, system + (1,)),
        TraceRequest(1.0, "b", "s2", 140, 4, system + (2,)),       # shares the system blocks with a
        TraceRequest(1.5, "c", "s3", 140, 4, tuple(range(200, 209))),  # shares nothing
    ]
    outcomes = asyncio.run(replay(trace, ReplayConfig(Target(gateway, timeout_s=60.0))))
    assert [o.status for o in outcomes] == [200, 200, 200]
    assert [o.output_tokens for o in outcomes] == [4, 4, 4] and not any(math.isnan(o.ttft_s) for o in outcomes)
    assert outcomes[1].cached_tokens >= 128 and outcomes[2].cached_tokens == 0
    # NOTE: each TTFT counts from its request's send, which is never before its arrival time
    assert all(0.0 <= late < 0.5 for late in sent_late(trace, outcomes))
    again = asyncio.run(replay(trace, ReplayConfig(Target(gateway, timeout_s=60.0))))  # a fresh salt: nothing cached
    assert [o.cached_tokens for o in again] == [0, outcomes[1].cached_tokens, 0]


def test_replay_prints_the_sim_tables_and_the_time_scale_against_a_speed_reference(gateway, tmp_path, capsys):
    path = tmp_path / "trace.jsonl"
    write_jsonl([TraceRequest(0.1 * i, f"r{i}", f"s{i}", 40, 3, (7, 8)) for i in range(4)], path)
    assert sim_main(["replay", str(path), "--url", gateway, "--rate-scale", "2", "--speed-reference", "0.02,0.002"]) == 0
    out = capsys.readouterr().out
    assert "ttft_p99" in out and "goodput" in out and "real" in out
    assert "host speed before the replay" in out and "kvmesh sim --time-scale" in out and "sent late by" in out
    with pytest.raises(SystemExit, match="speed-reference"):
        sim_main(["replay", str(path), "--url", gateway, "--speed-reference", "0.02"])


def test_the_host_speed_probe_times_a_lone_prefill_and_a_lone_stream(gateway):
    speed = asyncio.run(measure(Target(gateway, timeout_s=60.0), SpeedConfig(prompt_tokens=512, stream_tokens=16,
                                                                             repeats=2, settle_s=0.05)))
    assert 0 < speed.itl_s < speed.ttft_s < 5.0  # a 512-token prefill outlasts one decode step


def test_calibration_probes_the_mesh(gateway):
    config = ProbeConfig(lengths=(32, 256), repeats=1, streams=(1, 2), stream_tokens=8, stall_streams=(0, 2), burst=4,
                         visible_requests=3, visible_tokens=8,
                         stall_lengths=(256,), hit_new_tokens=(128,), admission_probe=0, context_points=((2, 256),), extra_repeats=0,
                         handback_points=((2, 64), (2, 256)), handback_lone_tokens=16, settle_s=0.05,
                         load_rates=(0.5, 1.0), load_seconds=1.0, load_block_s=0.5, load_prefix_tokens=64, load_fresh_tokens=32,
                         load_output_tokens=4, host_points=((1, 16), (2, 8)))
    samples = asyncio.run(probe(Target(gateway, timeout_s=60.0), config))
    assert [n for n, _ in samples.ttft] == [32, 256] and all(t > 0 for _, t in samples.ttft)
    assert [k for k, _ in samples.itl] == [1, 2] and all(t > 0 for _, t in samples.itl)
    assert [(k, x) for k, x, _ in samples.itl_long] == [(2, 256 + 4)] and samples.itl_long[0][2] > 0
    assert samples.hit[0][0] >= 240  # the repeated 256-token prompt: its full blocks came from the cache
    assert samples.hit[1][:2] == (128, 128)  # its first 128 tokens cached, 128 new ones after them
    assert len(samples.hit_lone) == 2 and all(t > 0 for t in samples.hit_lone)
    assert [(n, k) for n, k, *_ in samples.stall] == [(256, 0), (256, 2)] and len(samples.burst) == 1
    assert all(ttft > 0 for *_, ttft in samples.stall) and samples.stall[1][2] > 0  # the streams' gap beside it
    assert [(k, t) for k, t, _ in samples.handback] == [(2, 64 + 8), (2, 256 + 8)]  # turns per worker, tokens per turn
    assert [n for n, *_ in samples.shape] == [128, 384] and all(t > 0 for _, *ts in samples.shape for t in ts)
    assert len(samples.visible) == 3 and all(0 <= k <= 8 for k in samples.visible)
    # the path-load probe: its lone requests (run -1), then one run (repeats) of Poisson arrivals at two
    # rate levels in 0.5-s blocks, each request's level, arrival, lengths and TTFT. NOTE: rates of 0.5 and
    # 1 / a lone TTFT, so that a slow lone TTFT (a loaded test host: 0.2 s) still expects ~7 or more
    # arrivals; at 0.2 and 0.4 it expected 3, an empty run 5% of the time (this test failed once in five
    # parallel runs of the scheduler suite, its message cut off)
    assert {run for run, *_ in samples.load} == {-1.0, 0.0}
    assert {level for run, level, *_ in samples.load if run == 0} <= {0.0, 1.0}
    assert all(0 <= at < 2.0 and (prefix, fresh, out, index) == (64, 32, 4, 0.0) and ttft > 0  # one worker: one prefix
               for _, _, at, prefix, fresh, out, index, ttft in samples.load)
    # the host's CPU over the path-load run, and the host-load probe, on one worker too: its engine runs here.
    # NOTE: /proc counts every engine on this machine, so a run during which another test's mesh started or
    # stopped one is dropped (hostcpu.outside_engines_s; failed once under `make test`'s two workers); what is
    # recorded must be this run's (test_sim_hostcpu.py tests the recording itself)
    served = sum(1 for run, *_ in samples.load if run == 0)
    assert all((run, n, tokens) == (0.0, served, 4.0 * served) and cpu >= 0 for run, n, tokens, cpu in samples.load_cpu)
    assert [n for n, *_ in samples.host] in ([], [1.0], [2.0], [1.0, 2.0]) and all(cpu >= 0 for *_, cpu in samples.host)


def test_a_request_timed_to_its_first_token_counts_the_tokens_before_its_text(gateway):
    # NOTE: the tiny model writes random bytes: three of these greedy outputs start with the lead byte of a
    # multi-byte UTF-8 character, which the gateway holds back (no chunk) until the character is whole or
    # broken (U+FFFD); a byte that cannot start one shows as U+FFFD at once
    rng = random.Random(15)
    prompts = [[rng.randrange(32, 127) for _ in range(64)] for _ in range(8)]
    target = Target(gateway, timeout_s=60.0)

    async def run() -> tuple[list[int], list[int]]:
        async with new_client(target) as client:
            model = await served_model(client, target)
            hidden: list[int] = []
            chunks = []
            for p in prompts:
                await stream_one(client, target, model, p, 8, hidden=hidden)
                times: list[float] = []
                await stream_one(client, target, model, p, 8, token_times=times)
                chunks.append(len(times))
            return hidden, chunks

    hidden, chunks = asyncio.run(run())
    assert len(hidden) == 8 and all(0 <= k <= 8 for k in hidden) and any(k > 0 for k in hidden)
    # without logprobs a request whose first tokens were hidden streams fewer chunks than tokens
    assert all(c < 8 for k, c in zip(hidden, chunks, strict=True) if k > 0)
