"""End-to-end calibration (meshcal.py): the fit gives back the parameters that made the timings,
both from the model's formulas and from timings the simulator itself produced."""

import dataclasses

import pytest

from kvmesh.scheduler.policy import CostModel
from kvmesh.scheduler.sim import sim_main
from kvmesh.scheduler.sim.cluster import Cluster, SimConfig
from kvmesh.scheduler.sim.decodectx import hinge_s
from kvmesh.scheduler.sim.meshcost import MeshCost
from kvmesh.scheduler.sim.meshcal import MeshCalibration, Samples, fit, fit_beside, step_s
from kvmesh.scheduler.sim.meshprobe import ProbeConfig
from kvmesh.scheduler.sim.meshstreams import admitted_before_first_finish, itl_point, largest_gap, steady_itl
from kvmesh.scheduler.sim.report import outcome
from kvmesh.scheduler.sim.trace import TraceRequest
from kvmesh.scheduler.sim.workertime import shared_slowdown, step_host_s

TRUE = MeshCalibration(prefill_s_per_token=2.4e-4, decode_s_per_step=2.6e-3, decode_s_per_seq=1.0e-4,
                       request_overhead_s=0.031, request_busy_s=0.004, token_overhead_s=4.0e-4, hit_s_per_token=1.5e-5,
                       prefill_stall=0.8, prefill_share=0.05, admission_limit=None, attention_s_per_pair=1.1e-7,
                       decode_s_per_padded_token=5.0e-7, decode_padded_knee_tokens=6000.0,
                       prefill_s_per_stream=4.0e-4, attention_s_per_cached_pair=4.0e-8, prefill_s_beside=3.0e-3)
CONTEXT_POINTS = ProbeConfig().context_points
# 2 workers on a host that runs 1.5 at full speed, which spends 25 ms a request, 0.9 ms an engine step and 60 µs
# a token outside their engines
SHARED = dataclasses.replace(TRUE, host_parallelism=1.5, host_cpu_s_per_request=0.025, host_cpu_s_per_step=9e-4,
                             host_cpu_s_per_token=6e-5)
NEW_SHAPE = 4.0e-3  # a prefill step at a token count the worker has not run lately
FROM_FIRST = dataclasses.replace(TRUE, decode_s_per_kv_token=3.0e-7)  # context costs from the first KV token too


def formula_samples(cal: MeshCalibration, workers: int = 1) -> Samples:
    """What the probes would measure on a mesh of `workers` that the model describes exactly."""
    def work(n, cached=0):
        cached_pair = cal.attention_s_per_pair if cal.attention_s_per_cached_pair is None else cal.attention_s_per_cached_pair
        return n * cal.prefill_s_per_token + cal.attention_s_per_pair * n * n / 2 + cached_pair * n * cached

    def step(k, context=64.0):  # k streams of this mean context (the ITL probe's: 64)
        return step_s(cal, k) + hinge_s(k * context, cal.decode_s_per_padded_token, cal.decode_padded_knee_tokens,
                                        cal.decode_s_per_kv_token)

    host = MeshCost(host_parallelism=cal.host_parallelism, host_cpu_s_per_request=cal.host_cpu_s_per_request,
                    host_cpu_s_per_step=cal.host_cpu_s_per_step, host_cpu_s_per_token=cal.host_cpu_s_per_token)

    def slowdown(rows, arrivals, steps=None):
        """The shared host's slowdown (workertime.host_slowdown) with a busy worker of each of `rows` rows
        (their unslowed steps `steps`, default the short streams' step(rows)), `arrivals` requests in the
        last second."""
        steps = steps or [step(r) for r in rows]
        return shared_slowdown(host, len(rows), arrivals, sum(step_host_s(host, r) / u for r, u in zip(rows, steps, strict=True)))

    lone = slowdown([1], 1)  # a lone request: its worker busy with its one row

    def ttft(uncached, cached=0, new=True):  # every timed probe prefill is at a count not sent before
        new_shape = cal.prefill_s_new_shape if new else 0.0
        return (cal.request_overhead_s + cal.request_busy_s
                + lone * (work(uncached, cached) + cached * cal.hit_s_per_token + step(1) + new_shape))

    samples = Samples(workers=workers, itl_context=64.0)
    samples.ttft = [(n, ttft(n)) for n in (64, 256, 1024, 1536)]
    samples.hit = [(1520, 16, ttft(16, 1520)), (1024, 512, ttft(512, 1024))]  # the whole prompt again; prefix + new
    samples.hit_lone = [ttft(16), ttft(512)]

    def itl(k, context=64.0):  # k streams over min(k, W) workers, started together
        b = min(k, workers)
        unslowed = step(k / b, context)
        return slowdown([k / b] * b, k, [unslowed] * b) * unslowed

    samples.itl = [(k, itl(k)) for k in (1, 4, 8, 16)]
    long = [(k * workers, p + 32.0) for k, p in CONTEXT_POINTS]  # k streams per worker, p-token prompts
    samples.itl_long = [(k, x, itl(k, x)) for k, x in long]
    samples.burst = [(24, 32, ttft(32, new=False) + 23 * cal.request_busy_s)]  # one length: its counts are not new
    samples.shape = [(n, ttft(n + 1), ttft(n + 1, new=False)) for n in (128, 384)]  # a new count, then it again
    if workers > 1:
        samples.pair = [(workers, 1536, ttft(1536) + (workers - 1) * cal.request_busy_s
                         + (slowdown([1] * workers, workers) - lone) * (work(1536) + step(1) + cal.prefill_s_new_shape))]
    samples.host = [(n, s, t, n * cal.host_cpu_s_per_request + s * cal.host_cpu_s_per_step + t * cal.host_cpu_s_per_token)
                    for n, s, t in ((2, 512, 512), (8, 512, 2048), (16, 512, 4096), (16, 64, 512))] if cal.host_cpu_s_per_step else []
    samples.stall = [(n, 0, 0.0, 0.0, ttft(n)) for n in (512, 1536)]  # alone, then beside k streams
    for k in (2, 8, 16, 32):
        beside = k / min(k, workers)  # k streams over the workers
        b = min(k, workers)  # the prefill's worker runs one row more
        shared = slowdown([beside + 1] + [beside] * (b - 1), k + 1)
        for n in (512, 1536):
            prefill = shared * (work(n) * (1 + beside * cal.prefill_share) + cal.prefill_s_per_stream * beside
                                + cal.prefill_s_beside + step(beside + 1) + cal.prefill_s_new_shape)
            loaded_ttft = cal.request_overhead_s + cal.request_busy_s + prefill
            worker = prefill - shared * cal.prefill_s_beside  # the once-off term is latency only
            samples.stall.append((n, k, step(k) + cal.prefill_stall * worker, step(k), loaded_ttft))
    return samples


@pytest.mark.parametrize(("cal", "workers"), [(TRUE, 1), (SHARED, 2),
                                             (dataclasses.replace(TRUE, prefill_s_new_shape=NEW_SHAPE), 1),
                                             (dataclasses.replace(SHARED, prefill_s_new_shape=NEW_SHAPE), 2),
                                             (FROM_FIRST, 1), (dataclasses.replace(FROM_FIRST, host_parallelism=1.5), 2),
                                             (dataclasses.replace(SHARED, host_parallelism=1.0), 1)])
def test_fit_gives_back_the_parameters_of_timings_made_by_the_model(cal, workers):
    got = fit(formula_samples(cal, workers), engine_decode_s_per_seq=cal.decode_s_per_seq)
    assert got.admission_limit is None and set(got.noise) == {1.0}  # one lone request per length: no spread
    for name in ("prefill_s_per_token", "attention_s_per_pair", "decode_s_per_step", "decode_s_per_seq",
                 "decode_s_per_kv_token", "decode_s_per_padded_token",
                 "decode_padded_knee_tokens",
                 "request_overhead_s", "request_busy_s", "token_overhead_s", "hit_s_per_token", "prefill_stall",
                 "prefill_share", "prefill_s_per_stream", "prefill_s_beside", "host_parallelism", "attention_s_per_cached_pair",
                 "prefill_s_new_shape", "host_cpu_s_per_request", "host_cpu_s_per_step", "host_cpu_s_per_token"):
        assert getattr(got, name) == pytest.approx(getattr(cal, name), rel=1e-9, abs=1e-15), name


def test_without_a_lower_bound_the_whole_per_stream_slope_is_decode_s_per_seq():
    got = fit(formula_samples(TRUE))
    assert got.decode_s_per_seq == pytest.approx(TRUE.decode_s_per_seq + TRUE.token_overhead_s, rel=1e-9)
    assert got.token_overhead_s == pytest.approx(0.0, abs=1e-15)


def sim_outcomes(config: SimConfig, requests: list[TraceRequest]):
    return [outcome(r) for r in Cluster("round_robin", config).run(requests)]


@pytest.mark.parametrize("new_shape", [0.0, NEW_SHAPE])
def test_fit_gives_back_the_parameters_the_simulator_ran_with(new_shape):
    cost = CostModel(prefill_s_per_token=2.4e-4, decode_s_per_step=2.6e-3, decode_s_per_seq=1.0e-4)
    mesh = MeshCost(request_overhead_s=0.031, token_overhead_s=4.0e-4, hit_s_per_token=1.5e-5, prefill_share=0.05,
                    prefill_s_per_stream=4.0e-4, attention_s_per_pair=1.1e-7, attention_s_per_cached_pair=4.0e-8,
                    prefill_s_beside=3.0e-3, prefill_s_new_shape=new_shape)
    config = SimConfig(num_workers=1, cost=cost, mesh=mesh, warm_kernel_caches=False)  # the probes' counts are new
    samples = Samples()
    lone = [TraceRequest(10.0 * i, f"l{i}", "", n, 2, tuple(range(1000 * i, 1000 * i + n // 16)))
            for i, n in enumerate((64, 256, 1024, 1536))]
    samples.ttft = [(o.prompt_tokens - o.cached_tokens, o.ttft_s) for o in sim_outcomes(config, lone)]
    again = [TraceRequest(0.0, "a", "", 1540, 2, tuple(range(96))), TraceRequest(10.0, "b", "", 1540, 2, tuple(range(96)))]
    hit = sim_outcomes(config, again)[1]
    prefix = [TraceRequest(0.0, "p", "", 1024, 2, tuple(range(200, 264))),
              TraceRequest(10.0, "q", "", 1536, 2, tuple(range(200, 264)) + tuple(range(300, 332)))]
    mixed = sim_outcomes(config, prefix)[1]  # 1,024 cached tokens, then 512 new ones
    samples.hit = [(hit.cached_tokens, 1540 - hit.cached_tokens, hit.ttft_s), (mixed.cached_tokens, 512, mixed.ttft_s)]
    samples.hit_lone = [sim_outcomes(config, [TraceRequest(0.0, "c", "", n, 2, tuple(range(400, 400 + n // 16)))])[0].ttft_s
                        for n in (4, 512)]  # fresh prompts of their uncached tokens
    for k in (1, 4, 8):
        burst = [TraceRequest(0.0, f"k{k}-{j}", "", 32, 20, (10_000 + 10 * j, 10_001 + 10 * j)) for j in range(k)]
        samples.itl.append(itl_point(k, [o.itl_s for o in sim_outcomes(config, burst)]))
    for k in (0, 2, 8, 16):  # a prefill beside k streams (their gaps are not simulated: prefill_stall is 0 here)
        streams = [TraceRequest(0.0, f"s{j}", "", 32, 400, (20_000 + 10 * j, 20_001 + 10 * j)) for j in range(k)]
        for n in (512, 1536):
            loaded = sim_outcomes(config, [*streams, TraceRequest(0.5, "long", "", n, 2, tuple(range(30_000, 30_000 + n // 16)))])
            samples.stall.append((n, k, 0.0, 0.0, next(o for o in loaded if o.prompt_tokens == n).ttft_s))
    for n in (128, 384):  # a fresh prompt at a count the worker never ran, then another of that count
        pair = [TraceRequest(0.0, "cold", "", n, 2, tuple(range(40_000, 40_000 + n // 16))),
                TraceRequest(10.0, "warm", "", n, 2, tuple(range(50_000, 50_000 + n // 16)))]
        samples.shape.append((n, *(o.ttft_s for o in sorted(sim_outcomes(config, pair), key=lambda o: o.arrival_s))))
    got = fit(samples, engine_decode_s_per_seq=cost.decode_s_per_seq)
    assert got.prefill_s_new_shape == pytest.approx(new_shape, rel=1e-9, abs=1e-15)
    assert (got.prefill_share, got.prefill_s_per_stream, got.prefill_s_beside) == pytest.approx((0.05, 4.0e-4, 3.0e-3), rel=1e-9)
    assert hit.cached_tokens == 1536
    assert got.prefill_s_per_token == pytest.approx(cost.prefill_s_per_token, rel=1e-9)
    assert (got.decode_s_per_step, got.decode_s_per_seq) == pytest.approx((cost.decode_s_per_step, cost.decode_s_per_seq), rel=1e-9)
    assert (got.request_overhead_s, got.token_overhead_s) == pytest.approx((0.031, 4.0e-4), rel=1e-9)
    assert got.hit_s_per_token == pytest.approx(1.5e-5, rel=1e-6)
    assert got.attention_s_per_pair == pytest.approx(1.1e-7, rel=1e-6)
    assert got.attention_s_per_cached_pair == pytest.approx(4.0e-8, rel=1e-6)


@pytest.mark.parametrize("per_kv", [0.0, 3.0e-7])
def test_fit_gives_back_the_context_cost_of_simulated_decode_steps(per_kv):
    cost = CostModel(decode_s_per_step=2.6e-3, decode_s_per_seq=1.0e-4)
    config = SimConfig(num_workers=1, cost=cost, mesh=MeshCost(decode_s_per_kv_token=per_kv, decode_s_per_padded_token=5.0e-7,
                                                               decode_padded_knee_tokens=6000.0))
    samples = formula_samples(dataclasses.replace(TRUE, token_overhead_s=0.0))
    samples.itl, samples.itl_context = [], 32 + 20 / 2  # streams of 32 prompt + 20 output tokens: mean context 42
    for k in (1, 4, 8):
        burst = [TraceRequest(0.0, f"k{k}-{j}", "", 32, 20, (10_000 + 10 * j, 10_001 + 10 * j)) for j in range(k)]
        samples.itl.append(itl_point(k, [o.itl_s for o in sim_outcomes(config, burst)]))
    samples.itl_long = []
    for k, p in CONTEXT_POINTS:  # k streams of p prompt + 200 output tokens: mean context p + 100
        long = [TraceRequest(0.0, f"x{j}", "", p, 200, tuple(range(1000 * j, 1000 * j + p // 16))) for j in range(k)]
        samples.itl_long.append((k, p + 100, itl_point(k, [o.itl_s for o in sim_outcomes(config, long)])[1]))
    got = fit(samples, engine_decode_s_per_seq=cost.decode_s_per_seq)
    assert (got.decode_s_per_kv_token, got.decode_s_per_padded_token, got.decode_padded_knee_tokens) == pytest.approx(
        (per_kv, 5.0e-7, 6000.0), rel=1e-9, abs=1e-15)
    assert (got.decode_s_per_step, got.decode_s_per_seq) == pytest.approx((cost.decode_s_per_step, cost.decode_s_per_seq), rel=1e-9)


def test_the_admission_probe_counts_the_streams_admitted_before_the_first_finish():
    config = SimConfig(num_workers=1, mesh=MeshCost(admission_limit=3))
    burst = [TraceRequest(0.0, f"b{j}", "", 16, 24, (j,)) for j in range(5)]
    outcomes = sim_outcomes(config, burst)
    assert admitted_before_first_finish([o.first_token_s for o in outcomes], [o.finish_s for o in outcomes]) == 3
    samples = formula_samples(TRUE)
    samples.admitted, samples.probe_streams = 3, 5
    assert fit(samples).admission_limit == 3
    samples.admitted = 5  # every stream got in: the limit is above the probe, so unknown
    assert fit(samples).admission_limit is None


def test_steady_itl_counts_only_the_gaps_while_every_stream_decodes():
    a = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6]        # starts first, 0.1 s gaps
    b = [0.25, 0.35, 0.45, 0.55, 0.65, 2.0]        # all decoding in [0.25, 0.6]
    assert steady_itl([a, b]) == pytest.approx(0.1)
    assert steady_itl([a, b], [14, 12]) == pytest.approx(0.05)  # two tokens per chunk: coalesced by the gateway


def test_largest_gap_looks_only_at_gaps_overlapping_the_window():
    times = [0.0, 0.1, 0.2, 0.9, 1.0, 2.5]
    assert largest_gap(times, 0.15, 0.95) == pytest.approx(0.7)
    assert largest_gap(times, 1.0, 1.0) == pytest.approx(1.5)


@pytest.mark.parametrize("cal", [TRUE, SHARED])
def test_the_sim_takes_the_printed_mesh_flags(tmp_path, capsys, cal):
    flags = " ".join(cal.sim_flags()).split()
    assert ("--host-cpu-s-per-request" in flags) == (cal is SHARED)
    assert sim_main(["--workers", "1", "--policy", "round_robin", "--no-capacity", "--rate", "2", "--duration-s", "4",
                     "--warmup-s", "1", "--system-prompts", "2", *flags]) == 0
    out = capsys.readouterr().out
    assert "round_robin" in out and "goodput" in out


def test_fit_gives_back_how_the_simulated_shared_host_slows_busy_workers():
    cost = CostModel(prefill_s_per_token=2.4e-4, decode_s_per_step=2.6e-3, decode_s_per_seq=1.0e-4)
    config = SimConfig(num_workers=2, cost=cost, mesh=MeshCost(host_parallelism=1.5, attention_s_per_pair=1.1e-7))
    cal = dataclasses.replace(TRUE, request_overhead_s=0.0, request_busy_s=0.0, token_overhead_s=0.0, host_parallelism=1.5,
                              decode_s_per_padded_token=0.0)
    samples = formula_samples(cal, workers=2)  # lone requests, hits, stalls: as the model says; now from the sim:
    pair = [TraceRequest(0.0, f"p{j}", "", 1536, 1, tuple(range(100 * j, 100 * j + 96))) for j in range(2)]
    samples.pair = [(2, 1536, max(o.ttft_s for o in sim_outcomes(config, pair)))]  # round robin: one per worker
    samples.itl = []
    for k in (1, 4, 8):
        burst = [TraceRequest(0.0, f"k{k}-{j}", "", 32, 20, (10_000 + 10 * j, 10_001 + 10 * j)) for j in range(k)]
        samples.itl.append(itl_point(k, [o.itl_s for o in sim_outcomes(config, burst)]))
    got = fit(samples, engine_decode_s_per_seq=cost.decode_s_per_seq)
    assert got.host_parallelism == pytest.approx(1.5, rel=1e-9)
    assert (got.decode_s_per_step, got.decode_s_per_seq) == pytest.approx((cost.decode_s_per_step, cost.decode_s_per_seq), rel=1e-9)


def test_the_noise_is_the_spread_of_ttfts_beside_streams_else_of_lone_ones_and_the_sim_applies_it():
    samples = formula_samples(TRUE)
    before = fit(samples)
    factors = (0.9, 1.0, 1.0, 1.1, 3.0)
    deciles = (0.9, 0.9, 1.0, 1.0, 1.0, 1.0, 1.1, 1.1, 3.0, 3.0)
    # every repeat of each prefill beside k > 0 streams; the fit takes their medians, the noise their spread
    samples.stall = [(n, k, gap, itl, ttft * f) for n, k, gap, itl, ttft in samples.stall for f in (factors if k else (1.0,))]
    loaded = fit(samples)
    assert loaded.noise == pytest.approx(deciles, rel=1e-9)
    assert (loaded.prefill_share, loaded.prefill_s_per_stream) == pytest.approx((before.prefill_share, before.prefill_s_per_stream))
    lone = formula_samples(TRUE)
    fitted = dict(lone.ttft)
    lone.ttft = [(n, fitted[n] * f) for n in fitted for f in (1.0, 1.0, 1.05, 2.0, 0.5)]  # a spread of its own
    lone.stall = samples.stall
    assert fit(lone).noise == pytest.approx(deciles, rel=1e-9)  # beside streams wins over alone
    lone.stall = [p for p in lone.stall if p[1] == 0]  # no prefill beside streams: the lone spread
    lone.ttft = [(n, fitted[n] * f) for n in fitted for f in factors]
    assert fit(lone).noise == pytest.approx(deciles, rel=1e-9)
    cost = CostModel(prefill_s_per_token=1e-4)
    lone = [TraceRequest(0.0, "r", "", 1000, 1, ())]
    plain = sim_outcomes(SimConfig(num_workers=1, cost=cost, mesh=MeshCost(request_overhead_s=0.01)), lone)[0]
    noisy = sim_outcomes(SimConfig(num_workers=1, cost=cost, mesh=MeshCost(request_overhead_s=0.01, noise=(3.0,))), lone)[0]
    assert noisy.ttft_s == pytest.approx(3.0 * plain.ttft_s)


def test_the_share_and_the_per_stream_cost_of_a_prefill_beside_streams_are_told_apart_by_its_length():
    def extra(lone, k):
        return 0.02 * lone * k + 3.0e-4 * k
    points = [(lone, k, extra(lone, k)) for lone in (0.025, 0.075) for k in (8, 16, 32)]
    assert fit_beside(points) == pytest.approx((0.0, 0.02, 3.0e-4), abs=1e-12)
    additive = [(lone, k, 3.0e-4 * k) for lone in (0.025, 0.075) for k in (8, 16, 32)]
    assert fit_beside(additive) == pytest.approx((0.0, 0.0, 3.0e-4), abs=1e-12)


def test_the_once_off_cost_beside_any_stream_is_told_from_the_per_stream_one_by_the_stream_counts():
    def extra(lone, k):
        return 6.0e-3 + 0.01 * lone * k + 1.0e-4 * k
    points = [(lone, k, extra(lone, k)) for lone in (0.025, 0.075) for k in (2, 8, 16, 32)]
    assert fit_beside(points) == pytest.approx((6.0e-3, 0.01, 1.0e-4), rel=1e-9)
    flat = [(lone, k, 6.0e-3) for lone in (0.025, 0.075) for k in (2, 8, 16, 32)]  # the same beside 2 as beside 32
    assert fit_beside(flat) == pytest.approx((6.0e-3, 0.0, 0.0), abs=1e-12)
    assert fit_beside([(lone, 8, extra(lone, 8)) for lone in (0.025, 0.075)])[0] == 0.0  # one count: no once-off term


def test_relative_residuals_keep_the_long_prompts_noise_out_of_the_once_off_term():
    def extra(lone, k):
        return 6.0e-3 + 0.01 * lone * k + 1.0e-4 * k
    exact = [(lone, k, extra(lone, k)) for lone in (0.012, 0.07) for k in (2, 8, 16, 32)]
    scales = [0.02 if lone < 0.05 else 0.08 for lone, _, _ in exact]  # the lone TTFTs: the noise grows with them
    assert fit_beside(exact, scales) == pytest.approx((6.0e-3, 0.01, 1.0e-4), rel=1e-9)
    swing = {2: -1.0, 8: 1.0, 16: -1.0, 32: 1.0}  # ±8 ms at the long prompt, ±2 ms at the short one
    noisy = [(lone, k, e + swing[k] * (0.008 if lone > 0.05 else 0.002)) for lone, k, e in exact]
    assert abs(fit_beside(noisy, scales)[0] - 6.0e-3) < abs(fit_beside(noisy)[0] - 6.0e-3)


def test_with_one_prefill_length_only_the_share_is_fitted_and_neither_term_goes_negative():
    assert fit_beside([(0.075, k, 0.01 * 0.075 * k) for k in (8, 16, 32)]) == pytest.approx((0.0, 0.01, 0.0), abs=1e-12)
    assert fit_beside([(0.075, k, -0.001 * k) for k in (8, 16, 32)]) == (0.0, 0.0, 0.0)  # faster beside streams: noise
    assert fit_beside([]) == (0.0, 0.0, 0.0)


def test_a_prefill_beside_streams_takes_the_share_and_the_per_stream_cost_longer_in_the_sim():
    cost = CostModel(prefill_s_per_token=1e-4, decode_s_per_step=1e-3, decode_s_per_seq=0.0)
    streams = [TraceRequest(0.0, f"s{j}", "", 16, 2000, (100 + j,)) for j in range(10)]  # still decoding at 0.5 s
    long = TraceRequest(0.5, "long", "", 1024, 1, tuple(range(1000, 1064)))

    def ttft(mesh: MeshCost, beside: list[TraceRequest]) -> float:
        outcomes = sim_outcomes(SimConfig(num_workers=1, cost=cost, mesh=mesh), [*beside, long])
        return next(o for o in outcomes if o.prompt_tokens == 1024).ttft_s

    alone = ttft(MeshCost(prefill_share=0.05, prefill_s_per_stream=2e-3), [])
    assert alone == pytest.approx(1024 * 1e-4 + 1e-3)
    loaded = ttft(MeshCost(prefill_share=0.05, prefill_s_per_stream=2e-3), streams)
    assert loaded == pytest.approx(1024 * 1e-4 * (1 + 0.05 * 10) + 2e-3 * 10 + 1e-3)
    assert ttft(MeshCost(prefill_s_beside=6e-3), []) == pytest.approx(1024 * 1e-4 + 1e-3)  # alone: not paid
    assert ttft(MeshCost(prefill_s_beside=6e-3), streams) == pytest.approx(1024 * 1e-4 + 6e-3 + 1e-3)  # once, not per stream


def test_the_once_off_cost_beside_streams_is_latency_it_holds_neither_the_streams_nor_the_next_prefill():
    cost = CostModel(prefill_s_per_token=1e-4, decode_s_per_step=1e-3, decode_s_per_seq=0.0)
    stream = TraceRequest(0.0, "stream", "", 16, 2000, (100,))
    first = TraceRequest(0.5, "first", "", 1024, 1, tuple(range(1000, 1064)))
    queued = TraceRequest(0.5 + 1e-6, "queued", "", 512, 1, tuple(range(2000, 2032)))  # waits for first's step

    def run(beside: float) -> dict[str, object]:
        outcomes = sim_outcomes(SimConfig(num_workers=1, cost=cost, mesh=MeshCost(prefill_s_beside=beside, prefill_stall=1.0)),
                                [stream, first, queued])
        return {o.prompt_tokens: o for o in outcomes}

    without, with_it = run(0.0), run(6e-3)
    assert with_it[1024].ttft_s == pytest.approx(without[1024].ttft_s + 6e-3)  # its own first token comes later
    # the next step starts when first's ends, as without it; it is beside the stream too: its own latency only
    assert with_it[512].first_token_s == pytest.approx(without[512].first_token_s + 6e-3)
    assert with_it[16].finish_s == pytest.approx(without[16].finish_s)  # nor does the stream stall for it


def test_with_one_hit_shape_the_cached_pairs_cost_what_the_new_ones_do():
    cal = dataclasses.replace(TRUE, attention_s_per_cached_pair=None)
    samples = formula_samples(cal)
    samples.hit, samples.hit_lone = samples.hit[:1], samples.hit_lone[:1]  # the whole prompt again only
    got = fit(samples)
    assert got.attention_s_per_cached_pair == pytest.approx(TRUE.attention_s_per_pair, rel=1e-9)
    assert got.hit_s_per_token == pytest.approx(TRUE.hit_s_per_token, rel=1e-9)


def test_the_hit_cost_is_taken_against_the_lone_request_sent_beside_it_not_the_fit_when_there_is_one():
    samples = formula_samples(dataclasses.replace(TRUE, attention_s_per_cached_pair=None))
    samples.hit, samples.hit_lone = samples.hit[:1], samples.hit_lone[:1]
    samples.ttft += [(16, samples.hit_lone[0])] * 3  # the TTFT probe's 16-token repeats, outside the burst
    burst = 0.050  # the host's noise slowed the hit and the lone request after it alike
    samples.hit = [(c, u, t + burst) for c, u, t in samples.hit]
    samples.hit_lone = [t + burst for t in samples.hit_lone]
    assert fit(samples).hit_s_per_token == pytest.approx(TRUE.hit_s_per_token, rel=1e-9)
    samples.hit_lone = []  # saved timings from before the lone reference: against the TTFT fit, noise and all
    assert fit(samples).hit_s_per_token == pytest.approx(TRUE.hit_s_per_token + burst / 1520, rel=1e-9)


def test_the_hit_probes_lone_requests_are_points_of_the_prefill_fit_too():
    samples = formula_samples(TRUE)
    samples.ttft = [(n, t) for n, t in samples.ttft if n >= 1024]  # two lengths: alone, only a line
    got = fit(samples, engine_decode_s_per_seq=TRUE.decode_s_per_seq)  # with the hit probe's 16 and 512 fresh tokens
    assert (got.prefill_s_per_token, got.attention_s_per_pair) == pytest.approx((TRUE.prefill_s_per_token,
                                                                                 TRUE.attention_s_per_pair), rel=1e-9)
    assert got.request_overhead_s == pytest.approx(TRUE.request_overhead_s, rel=1e-9)


def test_a_hit_shapes_runs_pool_by_their_cached_count_so_one_burst_moves_no_median():
    from kvmesh.scheduler.sim.meshcal import fit_hits  # noqa: PLC0415

    hit, pair = 3e-6, 1.5e-8
    runs = [(1520.0, float(n), 0.0) for n in (1, 3, 5, 7, 9)] + [(1024.0, float(n), 0.0) for n in (517, 519, 521, 523, 525)]
    lone = [0.012] * len(runs)
    # each run's uncached count differs, as the probe sends them; the repeat costs c · hit + pair · n · c more
    samples = Samples(hit=[(c, n, 0.012 + c * hit + pair * n * c) for c, n, _ in runs], hit_lone=lone)
    samples.hit[2] = (1520.0, 5.0, samples.hit[2][2] + 0.047)  # a burst on one run of the whole prompt again
    # NOTE: the medians of n and of the extra may come from neighbouring runs: within 2 tokens × pair × c
    assert fit_hits(samples, 0.0, lone) == pytest.approx((hit, pair), rel=0.02)
