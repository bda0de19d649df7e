"""Every dashboard panel's query returns data from a real Prometheus scraping kvmesh.

Two sources: a synthetic exporter serving each METRICS.md metric (checks every query is valid
PromQL over the contract's names and labels, in seconds), and a real running mesh (checks the
services really expose what the dashboards ask for). Needs Debian's `prometheus` binary.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from kvmesh.runtime.pb import kvstore_pb2_grpc

from . import deployfiles as df
from .prom import Prometheus, SyntheticExporter, prometheus_binary, start_prometheus

QUERIES = df.prometheus_queries()
IDS = [f"{board.removesuffix('.json')}:{title}:{i}" for i, (board, title, _expr) in enumerate(QUERIES)]
PROMETHEUS = prometheus_binary()
needs_prometheus = pytest.mark.skipif(
    PROMETHEUS is None, reason="no `prometheus` binary on PATH (Debian: apt-get install -y prometheus; .ci/run does)"
)
SERVICES = ("gateway", "scheduler", "prefill", "decode", "kvstore", "canary")


def services_of(expr: str) -> set[str]:
    contract = df.metrics_md()
    return {contract[name]["service"] for name in df.metric_names(expr) if name in contract}


@pytest.fixture(scope="module")
def synthetic_prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    exporter = SyntheticExporter(df.metrics_md())
    target = exporter.start()
    prom = start_prometheus(PROMETHEUS, [target], tmp_path_factory.mktemp("prom-synthetic"))
    try:
        prom.wait_for_samples(targets=1, samples=3)
        yield prom
    finally:
        prom.stop()
        exporter.stop()


@needs_prometheus
@pytest.mark.parametrize(("board", "title", "expr"), QUERIES, ids=IDS)
def test_query_is_valid_over_the_metrics_contract(synthetic_prometheus: Prometheus, board: str, title: str,
                                                   expr: str) -> None:
    assert synthetic_prometheus.query(expr), f"{board} / {title}: no data for {expr}"


# -- against a running mesh ---------------------------------------------------------------------
def _send_traffic(client) -> None:
    """Enough requests to move every gateway, scheduler, worker and store metric: a long prompt
    (prefilled remotely), the same prefix again (cache hits), a second turn, streaming and not."""
    shared = "You are a careful assistant who answers in one short sentence. " * 4
    for i, question in enumerate(("What is a KV cache?", "Why disaggregate prefill and decode?")):
        messages = [{"role": "system", "content": shared}, {"role": "user", "content": question * 6}]
        reply = client.chat.completions.create(model="tiny", messages=messages, max_tokens=8)
        messages += [{"role": "assistant", "content": reply.choices[0].message.content or "ok"},
                     {"role": "user", "content": f"And in one word? ({i})"}]
        stream = client.chat.completions.create(model="tiny", messages=messages, max_tokens=8, stream=True)
        assert [chunk for chunk in stream]
    client.completions.create(model="tiny", prompt=shared, max_tokens=4)


def _send_bad_put(endpoint: str) -> None:
    """A client breaking the Put protocol (no commit), which the store refuses and counts."""
    with grpc.insecure_channel(endpoint) as channel:
        with pytest.raises(grpc.RpcError):
            kvstore_pb2_grpc.KvStoreStub(channel).Put(iter(()), timeout=5)


def _hold_a_rollout(canary: str) -> None:
    """A rollout that holds at its first step (it never gets its samples), so its step metrics exist."""
    import httpx  # noqa: PLC0415

    body = {"steps": [0.5, 1.0], "min_samples": 1_000_000}
    assert httpx.post(f"http://{canary}/rollout", json=body, timeout=10).status_code == 200


@pytest.fixture(scope="module")
def mesh_prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Prometheus, set[str]]]:
    # NOTE: no skips here: a service that cannot be imported, or the harness missing, is a failure.
    from tests.e2e.conftest import _start, _stop_and_check  # noqa: PLC0415
    # NOTE: a small KV store with short leases and a sub-second idle cap, so the traffic below
    # makes it evict (for room, and by idleness right after). Each finished turn is its own Put
    # (no hand-back window): a Put of several turns' fresh blocks can be larger than this whole
    # store, which refuses it outright, so nothing is stored and nothing evicted (a fresh-clone run
    # had all five of its batched Puts refused "no room while leased blocks are pinned").
    kvstore = ["kvstore.memory_bytes=262144", "kvstore.lease_s=0.1", "kvstore.idle_cap_s=0.5", "kvstore.tick_s=0.2",
               "decode.handback_window_s=0"]
    mesh = _start(tmp_path_factory, canary=True, candidate_decode=1, settings=["gateway.mirror_sample=1.0", *kvstore])
    prom = None
    try:
        targets = mesh.metrics_targets
        prom = start_prometheus(PROMETHEUS, targets, tmp_path_factory.mktemp("prom-mesh"))
        prom.wait_for_samples(targets=len(targets), samples=2)
        _send_traffic(mesh.openai_client())
        _send_bad_put(mesh.spec("kvstore").grpc_endpoint)
        _hold_a_rollout(mesh.spec("canary").metrics_target)
        # NOTE: the last requests' hand-back, KV events and idle evictions take ~1 s, more on a
        # loaded host (one run in a fresh clone had no eviction scraped after a fixed 1.5 s)
        deadline = time.time() + 15.0
        while not prom.query("kvmesh_kvstore_evictions_total") and time.time() < deadline:
            time.sleep(0.25)
        prom.wait_for_scrapes_after(time.time(), scrapes=3)
        down = prom.query("up == 0")
        assert not down, f"targets down: {down}"
        names = {r["metric"]["__name__"] for r in prom.query('count by (__name__) ({__name__=~"kvmesh_.+"})')}
        present = {s for s in SERVICES if any(n.startswith(f"kvmesh_{s}_") for n in names)}
        yield prom, present
    finally:
        if prom is not None:
            prom.stop()
        _stop_and_check(mesh)


@needs_prometheus
@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.parametrize(("board", "title", "expr"), QUERIES, ids=IDS)
def test_query_returns_data_from_a_running_mesh(mesh_prometheus: tuple[Prometheus, set[str]], board: str,
                                                title: str, expr: str) -> None:
    prom, present = mesh_prometheus
    absent = services_of(expr) - present
    # NOTE: the mesh runs every service, so one with no kvmesh_<service>_ metric has a broken
    # exporter: that fails here rather than showing up as a skip.
    assert not absent, f"{', '.join(sorted(absent))} exported no kvmesh metrics to Prometheus"
    assert prom.query(expr), (
        f"{board} / {title}: no data for {expr}\n(a labelled counter appears only once incremented: "
        "initialise its label values at startup, e.g. COUNTER.labels(tier, reason) for every known pair)"
    )
