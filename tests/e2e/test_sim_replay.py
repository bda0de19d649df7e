"""`kvmesh sim replay`'s client against a real mesh: a small trace sent at its arrival times
through the lean HTTP client (rawclient.py), every request answered in full, shared hash ids
served as real prefix-cache hits, and the CLI's table printed."""

from __future__ import annotations

import asyncio

from kvmesh.scheduler.sim.client import Target
from kvmesh.scheduler.sim.replay import ReplayConfig, replay, replay_main
from kvmesh.scheduler.sim.trace import TraceRequest, write_jsonl

SHARED = tuple(range(100, 108))  # 8 blocks of 16 tokens: a 128-token shared prefix


def trace() -> list[TraceRequest]:
    return [
        TraceRequest(0.0, "a", "s1", 160, 12, SHARED + (1, 2)),
        TraceRequest(0.1, "b", "s2", 48, 5, (7, 8, 9)),
        TraceRequest(1.5, "c", "s1", 150, 9, SHARED + (3,)),   # the first 128 tokens are a's
        TraceRequest(1.6, "d", "s3", 40, 7, (11, 12)),
    ]


def test_a_replay_gets_every_token_it_asked_for_and_shared_hash_ids_hit_the_cache(mesh):
    outcomes = asyncio.run(replay(trace(), ReplayConfig(Target(mesh.base_url), start_delay_s=0.1)))
    assert [o.status for o in outcomes] == [200] * 4
    assert [o.output_tokens for o in outcomes] == [12, 5, 9, 7]
    assert all(0 < o.ttft_s <= o.finish_s - o.arrival_s for o in outcomes)
    assert outcomes[2].cached_tokens >= 128, "c shares a's first 8 blocks"
    assert outcomes[3].cached_tokens == 0


def test_the_replay_command_prints_the_sims_table(mesh, tmp_path, capsys):
    path = tmp_path / "trace.jsonl"
    write_jsonl(trace(), path)
    assert replay_main([str(path), "--url", mesh.base_url]) == 0
    out = capsys.readouterr().out
    assert "4 requests" in out and "errors" in out
    real = [line for line in out.splitlines() if line.startswith("real")]
    assert len(real) == 2 and real[1].split()[-1] == "-", "no request failed"
