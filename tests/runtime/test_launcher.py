import itertools

import pytest

from kvmesh.runtime.launcher import MeshOptions, distinct_ports, parse_external, plan_mesh, setting_env, worker_threads


def plan(**options):
    ports = itertools.count(20000)
    return plan_mesh(MeshOptions(**options), lambda service: f"nats://{service}@127.0.0.1:4222", port_of=lambda: next(ports))


def test_default_mesh_starts_store_scheduler_workers_then_gateway():
    specs = plan(cpus=4)
    assert [s.name for s in specs] == ["kvstore", "scheduler", "prefill-0", "decode-0", "gateway"]
    gateway = specs[-1]
    assert gateway.args == ("--host", "127.0.0.1", "--port", "8000", "--scheduler", "127.0.0.1:20002")
    decode = specs[3]
    assert ("--kvstore", "127.0.0.1:20000") == decode.args[-2:]
    assert decode.env["KVMESH_NATS_URL"] == "nats://decode@127.0.0.1:4222"
    assert decode.metrics_target == "127.0.0.1:20007"
    assert decode.env["KVMESH_DECODE_TORCH_THREADS"] == "1"  # 4 cpus, one left to the rest, 2 workers


def test_candidate_pool_gets_its_own_model_and_settings():
    specs = plan(prefill=0, candidate_decode=1, candidate_model="/m2", canary=True,
                 settings=["decode.kv_encoding=int8"], candidate_settings=["decode.step_delay_s=0.1"])
    names = [s.name for s in specs]
    assert names == ["kvstore", "scheduler", "decode-0", "decode-candidate-0", "canary", "gateway"]
    prod, cand = specs[2], specs[3]
    assert prod.env["KVMESH_DECODE_KV_ENCODING"] == "int8" and "KVMESH_DECODE_STEP_DELAY_S" not in prod.env
    assert cand.env["KVMESH_DECODE_STEP_DELAY_S"] == "0.1" and cand.env["KVMESH_MODEL"] == "/m2"
    assert plan(settings=["decode.torch_threads=3"])[3].env["KVMESH_DECODE_TORCH_THREADS"] == "3"
    assert "--pool" in cand.args and cand.args[cand.args.index("--pool") + 1] == "candidate"


def test_candidate_workers_and_the_canary_run_at_idle_cpu_priority_unless_told_otherwise():
    specs = {s.name: s for s in plan(candidate_prefill=1, candidate_decode=1, canary=True)}
    priority = {name: spec.env.get("KVMESH_CPU_PRIORITY", "normal") for name, spec in specs.items()}
    assert priority == {"kvstore": "normal", "scheduler": "normal", "prefill-0": "normal", "decode-0": "normal",
                        "prefill-candidate-0": "idle", "decode-candidate-0": "idle", "canary": "idle",
                        "gateway": "normal"}
    specs = plan(candidate_decode=1, canary=True, candidate_cpu_priority="normal")
    assert {s.env.get("KVMESH_CPU_PRIORITY", "normal") for s in specs} == {"normal"}


def test_worker_threads_leave_a_core_and_split_the_rest():
    assert [worker_threads(cpus, 2) for cpus in (1, 2, 3, 5, 16)] == [1, 1, 1, 2, 7]
    assert worker_threads(16, 1) == 15


def test_setting_env_rejects_unknown_services():
    assert setting_env(["gateway.mirror_sample=1"]) == {"gateway": {"KVMESH_GATEWAY_MIRROR_SAMPLE": "1"}}
    with pytest.raises(ValueError, match="bad --set 'router.x=1'"):
        setting_env(["router.x=1"])


def test_no_port_is_handed_out_twice_even_when_the_os_offers_it_again():
    offers = iter([8000, 20001, 20001, 4222, 20002, 20001, 20003, 20004, 20005, 20006, 20007, 20008])
    specs = plan_mesh(MeshOptions(prefill=0, kvstore=False), lambda s: "nats://x", port_of=lambda: next(offers),
                      taken=[4222])
    ports = [int(spec.grpc_endpoint.rsplit(":", 1)[1]) for spec in specs if spec.grpc_endpoint]
    ports += [int(spec.metrics_target.rsplit(":", 1)[1]) for spec in specs if spec.metrics_target and spec.service != "gateway"]
    assert sorted(ports) == [20001, 20002, 20003, 20004]
    with pytest.raises(OSError, match="no distinct free port"):
        next_port = distinct_ports(lambda: 1, taken=[1])
        next_port()


def test_external_roles_are_not_started_and_their_endpoints_are_used() -> None:
    opts = MeshOptions(decode=1, external=["decode=10.0.0.9:7000", "kvstore=10.0.0.8:7001", "scheduler=10.0.0.7:7002"])
    specs = plan_mesh(opts, lambda service: "nats://x", port_of=iter(range(20000, 20100)).__next__)
    assert [s.service for s in specs] == ["prefill", "decode", "gateway"]
    assert all("10.0.0.8:7001" in s.args for s in specs if s.service in ("prefill", "decode"))
    gateway = next(s for s in specs if s.service == "gateway")
    assert gateway.args[gateway.args.index("--scheduler") + 1] == "10.0.0.7:7002"
    assert parse_external(["decode=a:1", "decode=b:2"]) == {"decode": ["a:1", "b:2"]}
    for bad in (["decode"], ["nope=a:1"], ["kvstore=a:1", "kvstore=b:2"], ["decode=a:x"]):
        with pytest.raises(ValueError):
            parse_external(bad)


def test_replicas_shards_and_their_clients_are_planned():
    specs = {s.name: s for s in plan(schedulers=2, kvstores=3, prefill=1, decode=1, canary=True)}
    assert [n for n in specs if n.startswith(("kvstore", "scheduler"))] == [
        "kvstore-0", "kvstore-1", "kvstore-2", "scheduler-0", "scheduler-1"]
    schedulers = [specs[f"scheduler-{i}"].grpc_endpoint for i in range(2)]
    gateway = specs["gateway"].args
    assert gateway[gateway.index("--scheduler") + 1] == ",".join(schedulers)
    assert specs["scheduler-1"].args[specs["scheduler-1"].args.index("--replica-id") + 1] == "scheduler-1"
    for worker in ("prefill-0", "decode-0"):
        assert specs[worker].args[-2:] == ("--kvstore", "nats")  # shards found from their announcements
    assert specs["kvstore-2"].args[specs["kvstore-2"].args.index("--store-id") + 1] == "kvstore-2"
    with pytest.raises(ValueError, match=">= 1"):
        plan(schedulers=0)


def test_free_ports_are_bindable_and_below_the_kernels_ephemeral_range(tmp_path):
    import socket

    from kvmesh.runtime.launcher import PORT_FLOOR, ephemeral_low, free_port

    high = ephemeral_low()
    low = PORT_FLOOR if high - PORT_FLOOR >= 1000 else 1024
    ports = {free_port() for _ in range(20)}
    assert all(low <= p < high for p in ports) and len(ports) > 1
    for port in list(ports)[:3]:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
    custom = tmp_path / "range"
    custom.write_text("40000\t60999\n")
    assert ephemeral_low(str(custom)) == 40000
    assert ephemeral_low(str(tmp_path / "missing")) == 32768


def test_free_port_never_gives_a_port_another_caller_got_lately(tmp_path, monkeypatch):
    """Two meshes starting at once (pytest-xdist workers) drew the same port before either bound it;
    a port given out is noted in the registry and skipped by every later draw until it is stale."""
    import itertools
    import os
    import time

    from kvmesh.runtime import launcher

    registry = tmp_path / "ports"
    monkeypatch.setenv("KVMESH_PORT_REGISTRY", str(registry))
    first = launcher.free_port()
    assert (registry / str(first)).exists()
    others = (p for p in range(launcher.PORT_FLOOR, launcher.ephemeral_low()) if p != first)
    draws = itertools.chain([first, first], others)
    monkeypatch.setattr(launcher.random, "randrange", lambda lo, hi: next(draws))
    second = launcher.free_port()
    assert second != first  # noted a moment ago: skipped, though nothing is bound to it

    stale = time.time() - launcher.PORT_HOLD_S - 1
    os.utime(registry / str(first), (stale, stale))
    draws = iter([first])
    assert launcher.free_port() == first  # a stale note is taken over
    assert time.time() - (registry / str(first)).stat().st_mtime < launcher.PORT_HOLD_S


def test_free_port_draws_alone_when_the_registry_cannot_be_written(tmp_path, monkeypatch):
    from kvmesh.runtime import launcher

    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("KVMESH_PORT_REGISTRY", str(blocker / "ports"))  # under a file: no directory can be made
    ports = {launcher.free_port() for _ in range(5)}
    low = launcher.PORT_FLOOR if launcher.ephemeral_low() - launcher.PORT_FLOOR >= 1000 else 1024
    assert all(low <= p < launcher.ephemeral_low() for p in ports)
