"""`kvmesh up --pin-engines`: CPU lists, the layout, the environment each process gets, and the pinning itself."""

import itertools
import os
import subprocess
import sys

import pytest

from kvmesh.runtime import launcher
from kvmesh.runtime.launcher import CpuLayout, MeshOptions, cpu_layout, mesh_cpu_layout, plan_mesh
from kvmesh.runtime.process import format_cpu_list, parse_cpu_list


def test_cpu_lists_read_and_write_ranges():
    assert parse_cpu_list("0-2,5, 7") == {0, 1, 2, 5, 7}
    assert parse_cpu_list("") == frozenset()
    assert format_cpu_list([5, 0, 2, 1, 7, 6]) == "0-2,5-7"
    assert format_cpu_list([3]) == "3"
    for text in ("0-2,5-7", "1", "0,2,4", "0-15"):
        assert format_cpu_list(parse_cpu_list(text)) == text


@pytest.mark.parametrize("bad", ["a", "1-", "-1", "3-1", "0;1", "1.5"])
def test_a_bad_cpu_list_is_refused_by_name(bad):
    with pytest.raises(ValueError, match="CPU list"):
        parse_cpu_list(bad)


def test_each_engine_gets_cpus_of_its_own_from_the_top_and_the_rest_share_what_is_left():
    assert cpu_layout([0, 1], engines=1, threads=1) == CpuLayout("0", ("1",))
    assert cpu_layout(range(8), engines=2, threads=3) == CpuLayout("0-1", ("5-7", "2-4"))
    assert cpu_layout([2, 4, 6, 8], engines=1, threads=2) == CpuLayout("2,4", ("6,8",))
    assert cpu_layout([0, 1], engines=0, threads=1) == CpuLayout()


def test_a_layout_that_leaves_nothing_for_the_rest_of_the_mesh_is_refused():
    with pytest.raises(ValueError, match="leave none of the 2 CPUs"):
        cpu_layout([0, 1], engines=2, threads=1)


def plan(monkeypatch, allowed, **options):
    monkeypatch.setattr(launcher.os, "sched_getaffinity", lambda pid: set(allowed), raising=False)
    ports = itertools.count(20000)
    opts = MeshOptions(**options)
    return opts, plan_mesh(opts, lambda service: "nats://x", port_of=lambda: next(ports))


def test_pinned_mesh_gives_every_process_the_shared_cpus_and_each_engine_its_own(monkeypatch):
    opts, specs = plan(monkeypatch, range(4), cpus=4, prefill=1, decode=1, pin_engines=True)
    env = {s.name: s.env for s in specs}
    # 2 workers on 4 CPUs: one torch thread each (worker_threads), engines on CPUs 3 and 2
    assert env["decode-0"]["KVMESH_DECODE_TORCH_THREADS"] == "1"
    assert env["prefill-0"]["KVMESH_PREFILL_ENGINE_CPUS"] == "3"
    assert env["decode-0"]["KVMESH_DECODE_ENGINE_CPUS"] == "2"
    assert {name: e["KVMESH_CPUS"] for name, e in env.items()} == dict.fromkeys(env, "0-1")
    assert mesh_cpu_layout(opts).shared == "0-1"  # what nats-server gets


def test_candidates_share_the_rest_and_a_set_engine_cpus_wins(monkeypatch):
    _, specs = plan(monkeypatch, range(4), cpus=4, prefill=0, decode=1, candidate_decode=1, pin_engines=True)
    env = {s.name: s.env for s in specs}
    assert env["decode-0"]["KVMESH_DECODE_ENGINE_CPUS"] == "3"
    assert "KVMESH_DECODE_ENGINE_CPUS" not in env["decode-candidate-0"]
    assert env["decode-candidate-0"]["KVMESH_CPUS"] == "0-2"
    _, specs = plan(monkeypatch, range(4), cpus=4, prefill=0, decode=1, pin_engines=True,
                    settings=["decode.engine_cpus=2-3"])
    assert specs[2].env["KVMESH_DECODE_ENGINE_CPUS"] == "2-3"


def test_unpinned_mesh_sets_no_cpus(monkeypatch):
    _, specs = plan(monkeypatch, range(4), prefill=1, decode=1)
    assert not any("KVMESH_CPUS" in s.env or any(k.endswith("ENGINE_CPUS") for k in s.env) for s in specs)


pinnable = pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                              reason="pinning needs Linux and two CPUs")


def _in_child(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "import os, threading\nfrom kvmesh.runtime.process import apply_cpus\n"
                           + code], capture_output=True, text=True, timeout=60)


@pinnable
def test_apply_cpus_pins_the_process_and_the_threads_it_already_has():
    cpu = max(os.sched_getaffinity(0))
    done = _in_child(
        "stop = threading.Event()\n"
        "t = threading.Thread(target=stop.wait); t.start()\n"
        f"apply_cpus('{cpu}')\n"
        "print(sorted(os.sched_getaffinity(0)), sorted(os.sched_getaffinity(t.native_id)))\n"
        "stop.set()\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [f"[{cpu}]", f"[{cpu}]"]


@pinnable
def test_apply_cpus_can_move_a_process_off_the_cpus_it_started_on():
    low, high = min(os.sched_getaffinity(0)), max(os.sched_getaffinity(0))
    done = _in_child(f"os.sched_setaffinity(0, {{{low}}})\napply_cpus('{high}')\nprint(sorted(os.sched_getaffinity(0)))\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"[{high}]"


@pinnable
def test_apply_cpus_refuses_cpus_this_machine_lacks():
    done = _in_child("apply_cpus('4000')\n")
    assert done.returncode != 0
    assert "CPU list '4000': this process may not run there" in done.stderr
