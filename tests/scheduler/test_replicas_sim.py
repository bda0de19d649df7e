"""`kvmesh sim --routers K`: K scheduler replicas, each with its own view of the KV events."""

import pytest

from kvmesh.scheduler.sim import sim_main
from kvmesh.scheduler.sim.cluster import Cluster, SimConfig
from kvmesh.scheduler.sim.trace import SyntheticConfig, synthetic

TINY = SyntheticConfig(duration_s=4.0, num_system_prompts=2, system_prompt_tokens=(64, 128), user_tokens=(16, 48),
                       output_tokens=(4, 8), think_time_s=0.5)


def test_replicas_take_arrivals_in_turn_see_events_late_and_each_completes_its_own():
    trace = synthetic(TINY, rate=8.0)
    cluster = Cluster("kv_aware", SimConfig(num_workers=4, routers=3, event_delay_s=0.1))
    results = cluster.run(trace)
    assert len(results) == len(trace)
    assert {r.router for r in results} == {0, 1, 2}
    assert [cluster._event_delay_s(j) for j in range(3)] == pytest.approx([0.1, 0.15, 0.2])
    assert all(router.registry.open_assignments() == 0 for router in cluster.routers)
    assert all(router.index.num_entries > 0 for router in cluster.routers)


def test_the_cli_prints_one_group_per_replica_count_with_its_ratio(capsys):
    assert sim_main(["--workers", "2", "--routers", "1,2", "--policy", "kv_aware", "--duration-s", "2",
                     "--warmup-s", "1", "--search-steps", "1"]) == 0
    out = capsys.readouterr().out
    assert "# 2 workers, 1 scheduler replica(s)" in out and "# 2 workers, 2 scheduler replica(s)" in out
    assert "# 2 workers: kv_aware with 2 replicas = " in out
