"""sim/hostcpu.py: the host's busy CPU and its engines', read from /proc texts, and the host-load
probe (meshprobe.py) that turns them into the CPU a request costs outside the engines."""

import asyncio
from dataclasses import replace

import pytest

from kvmesh.scheduler.policy import CostModel
from kvmesh.scheduler.sim import hostcpu, meshprobe
from kvmesh.scheduler.sim.cluster import Cluster, SimConfig
from kvmesh.scheduler.sim.hostcpu import CpuReading, host_busy_s, is_engine_process, is_engine_thread, outside_engines_s, task_cpu_s
from kvmesh.scheduler.sim.meshcal import fit_host
from kvmesh.scheduler.sim.meshcost import MeshCost
from kvmesh.scheduler.sim.meshprobe import ProbeConfig, _Prober
from kvmesh.scheduler.sim.report import Outcome
from kvmesh.scheduler.sim.trace import TraceRequest

STAT = """cpu  1000 20 300 9000 50 7 3 0 0 0
cpu0 500 10 150 4500 25 4 2 0 0 0
intr 12345
"""


def test_the_hosts_busy_time_leaves_out_idle_and_iowait():
    assert host_busy_s(STAT, 100.0) == pytest.approx((1000 + 20 + 300 + 7 + 3 + 0) / 100)
    with pytest.raises(ValueError):
        host_busy_s("intr 1\n", 100.0)


def test_a_tasks_cpu_is_its_user_and_system_time_whatever_its_name_holds():
    # pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime ...
    text = "4242 (python -m x) S 1 4242 4242 0 -1 4194304 10 0 0 0 250 50 0 0 20 0 3 0"
    assert task_cpu_s(text, 100.0) == pytest.approx(3.0)


def test_an_engine_is_a_worker_enginehost_process_or_an_engine_thread():
    assert is_engine_process(["/venv/bin/python", "-m", "kvmesh.decode.enginehost", "--fd", "5"])
    assert not is_engine_process(["/venv/bin/python", "-m", "kvmesh", "decode"])
    assert is_engine_thread("decode-engine\n") and not is_engine_thread("grpc_global_tim")


def test_outside_the_engines_is_the_hosts_time_less_theirs_and_nothing_without_an_engine_here():
    before, after = CpuReading(100.0, 10.0, 2), CpuReading(103.0, 11.5, 2)
    assert outside_engines_s(before, after) == pytest.approx(1.5)
    assert outside_engines_s(CpuReading(100.0, 0.0, 0), CpuReading(103.0, 0.0, 0)) is None  # the mesh is elsewhere
    assert outside_engines_s(before, CpuReading(103.0, 11.5, 1)) is None  # an engine went away meanwhile


def test_the_real_host_reads_as_busy_time_that_only_grows():
    first = hostcpu.read()
    sum(i * i for i in range(200_000))
    assert hostcpu.read().host_s >= first.host_s > 0


class HostMesh(_Prober):
    """A mesh whose host spends 20 ms a request and 50 µs a token outside its engines; no sleeps."""

    def __init__(self, config: ProbeConfig, engines: int) -> None:
        super().__init__(None, None, "fake", config, sleep=self.record_sleep)
        self.engines, self.requests, self.cpu = engines, [], 0.0

    async def record_sleep(self, seconds: float) -> None:
        pass

    async def one(self, tokens, max_tokens, times=None, hidden=None):  # noqa: ANN001, ARG002
        self.requests.append((len(tokens), max_tokens))
        self.cpu += 0.020 + 50e-6 * max_tokens
        return Outcome(0.0, len(tokens), max_tokens, 0.01, 0.02)

    def read(self) -> CpuReading:
        return CpuReading(1000.0 + self.cpu, 0.0, self.engines)


@pytest.mark.parametrize(("workers", "engines"), [(2, 2), (2, 0), (1, 1), (1, 0)])
def test_the_host_load_probe_sends_streams_and_measures_only_with_the_engines_here(monkeypatch, workers, engines):
    config = ProbeConfig(workers=workers, repeats=2, host_points=((1, 256), (8, 32)))
    mesh = HostMesh(config, engines)
    monkeypatch.setattr(hostcpu, "read", mesh.read)
    asyncio.run(mesh.host_load())
    if not engines:
        assert mesh.samples.host == [] and mesh.requests == [(32, 256)] * workers  # one run, then nothing more
        return
    # (requests, steps: the workers × the tokens of their streams, tokens, CPU outside the engines)
    n, m = workers, 8 * workers
    want = ([(float(n), 256.0 * n, 256.0 * n, n * 0.020 + 256 * n * 50e-6)] * 2
            + [(float(m), 32.0 * n, 32.0 * m, m * 0.020 + 32 * m * 50e-6)] * 2)
    assert [x for run in mesh.samples.host for x in run] == pytest.approx([x for run in want for x in run])
    assert mesh.requests[:n] == [(32, 256)] * n  # the first run checks for engines here; its figures are not kept


def test_the_fit_splits_the_hosts_cpu_into_requests_steps_and_tokens():
    per = (0.025, 0.9e-3, 60e-6)
    points = [(n, s, t, per[0] * n + per[1] * s + per[2] * t) for n, s, t in
              ((2, 512, 512), (8, 512, 2048), (16, 512, 4096), (16, 64, 512))]
    got = fit_host(points)
    assert (got["host_cpu_s_per_request"], got["host_cpu_s_per_step"], got["host_cpu_s_per_token"]) == pytest.approx(per)
    assert fit_host([(32.0, 1.6)]) == pytest.approx({"host_cpu_s_per_request": 0.05, "host_cpu_s_per_step": 0.0,
                                                    "host_cpu_s_per_token": 0.0})  # stop 34's first probe's runs
    assert fit_host([]) == {}


def durations(mesh: MeshCost, requests: list[TraceRequest]) -> dict[str, float]:
    config = SimConfig(num_workers=2, cost=CostModel(prefill_s_per_token=1e-4, decode_s_per_step=2e-3, decode_s_per_seq=1e-4),
                       mesh=mesh)
    return {r.request.request_id: r.finish_s - r.request.arrival_s for r in Cluster("round_robin", config).run(requests)}


def test_the_sims_busy_workers_slow_with_the_requests_of_the_last_second_on_a_shared_host():
    burst = [TraceRequest(0.001 * i, f"b{i}", "", 32, 100, (i,)) for i in range(10)]  # 10 a second on both workers
    late = [TraceRequest(10.0, "late", "", 32, 100, (99,))]  # alone on the host, 10 s later
    shared = MeshCost(host_parallelism=1.9)
    idle, loaded = durations(shared, burst + late), durations(replace(shared, host_cpu_s_per_request=0.05), burst + late)
    # both workers busy beside 10 × 0.05 s a second of the mesh's work: (2 + 0.5) / 1.9 against 2 / 1.9, once
    # all 10 have come (a sequence decodes at the slowdown of its first token's time)
    ratios = [loaded[f"b{i}"] / idle[f"b{i}"] for i in range(10)]
    assert all(1.1 < x <= 2.5 / 2 + 1e-9 for x in ratios) and max(ratios) == pytest.approx(2.5 / 2, rel=0.01)
    assert loaded["late"] == pytest.approx(idle["late"])  # 1 busy worker + 0.05 cores: the host has room
    own_hosts = MeshCost(host_cpu_s_per_request=0.05)  # no shared host: the mesh's work slows nothing
    assert durations(own_hosts, burst + late) == durations(MeshCost(), burst + late)


def test_a_host_load_run_whose_engine_restarted_is_dropped_and_the_probe_goes_on(monkeypatch):
    config = ProbeConfig(workers=2, repeats=2, host_points=((1, 256), (8, 32)))
    mesh = HostMesh(config, 2)
    reads = iter(range(1000))
    # reads 0-1: the engine check; 2-3: (1, 256) #1; 4-5: (8, 32) #1, whose engine restarted; 6-9: the second round
    monkeypatch.setattr(hostcpu, "read", lambda: replace(mesh.read(), engines=1 if next(reads) == 5 else 2))
    asyncio.run(mesh.host_load())
    assert [run[0] for run in mesh.samples.host] == [2.0, 2.0, 16.0]  # the restarted run is gone, the rest stand


@pytest.mark.parametrize("engines", [1, 0])
def test_a_path_load_run_reads_the_hosts_cpu_over_its_requests_only_with_the_engines_here(monkeypatch, engines):
    config = ProbeConfig(repeats=2, load_rates=(0.5,), load_seconds=1.0, load_block_s=1.0, load_prefix_tokens=64,
                         load_fresh_tokens=32, load_output_tokens=4)
    mesh = HostMesh(config, engines)
    monkeypatch.setattr(hostcpu, "read", mesh.read)

    async def stream_one(client, target, model, tokens, max_tokens, **_):  # noqa: ANN001, ANN202, ARG001
        return await mesh.one(tokens, max_tokens)

    monkeypatch.setattr(meshprobe, "stream_one", stream_one)
    asyncio.run(mesh.path_load())
    runs = {run: sum(1 for r, *_ in mesh.samples.load if r == run) for run in (0.0, 1.0)}
    # (run, requests served, tokens streamed, CPU outside the engines over the run: 20 ms + 50 µs a token each)
    want = [(run, float(n), 4.0 * n, n * (0.020 + 4 * 50e-6)) for run, n in runs.items()] if engines else []
    assert [x for run in mesh.samples.load_cpu for x in run] == pytest.approx([x for run in want for x in run])
