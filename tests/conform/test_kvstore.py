"""Our kvstore passes `kvmesh conform kvstore` (one process, every clause K1..); broken stores
(a proxy that lies in one reply, a store that heartbeats too slowly) fail the intended clause."""

from __future__ import annotations

import asyncio
import sys
import zlib
from collections.abc import Iterator

import pytest

from kvmesh.conform.kvstore import REGISTRY
from kvmesh.runtime.launcher import free_port
from kvmesh.runtime.pb import kvstore_pb2

from .breaker import changed
from .conftest import Service, assert_conforms, assert_fails_only, broken_suite, suite


STORE_BYTES = 16 * 2048   # sixteen of the suite's blocks (float32 [2, 2, 16, 2, 4])


def start_store(nats_url: str, log, **env: str) -> tuple[Service, str]:  # noqa: ANN001
    port = free_port()
    store = Service("kvstore", ["--port", str(port), "--metrics-port", "-1", "--store-id", f"kvstore-conform-{port}"],
                    {"KVMESH_NATS_URL": nats_url, **env}, log)
    store.wait_grpc(f"127.0.0.1:{port}")
    return store, f"127.0.0.1:{port}"


@pytest.fixture(scope="module")
def store(nats, tmp_path_factory) -> Iterator[tuple[Service, str]]:  # noqa: ANN001
    service, endpoint = start_store(nats.url, tmp_path_factory.mktemp("kvstore") / "kvstore.log")
    yield service, endpoint
    service.stop()


def _corrupt_raw(block):  # noqa: ANN001, ANN202
    return changed(block) if block.header.encoding > 1 else _flip(block)


def _flip(block):  # noqa: ANN001, ANN202
    out = changed(block)
    out.header.checksum ^= 1
    return out


def _one_chain(message):  # noqa: ANN001, ANN202 - a store that ignores `new_chain`
    if message.WhichOneof("msg") != "blocks" or not message.blocks.new_chain:
        return message
    out = changed(message)
    out.blocks.new_chain, out.blocks.parent_hash = False, b""
    return out


def _run_as_empty(message):  # noqa: ANN001, ANN202 - a store older than KvBlockRun reads `runs` as no message
    return kvstore_pb2.PutMessage() if message.WhichOneof("msg") == "runs" else message


def _run_unchecked(message):  # noqa: ANN001, ANN202 - a store that takes a run's blocks without their checksums
    if message.WhichOneof("msg") != "runs":
        return message
    out = changed(message)
    for run in out.runs.runs:
        size = len(run.data) // max(1, len(run.block_hashes))
        run.checksums[:] = [zlib.crc32(run.data[i * size:(i + 1) * size]) for i in range(len(run.block_hashes))]
    return out


BROKEN = {
    "K5": {"replies": {"KvStore/Put": lambda r: changed(r, stored=r.stored + r.duplicates, duplicates=0)}},
    "K9": {"replies": {"KvStore/Get": _corrupt_raw}},
    "K18": {"requests": {"KvStore/Put": _one_chain}},
    "K19": {"replies": {"KvStore/LookupChains": lambda r: changed(r, chains=list(reversed(r.chains)))}},
    "K20": {"requests": {"KvStore/Put": _run_unchecked}},
}


@pytest.mark.parametrize("clause_id", sorted(BROKEN))
async def test_broken_store_fails_the_clause(store, nats, clause_id: str) -> None:  # noqa: ANN001
    results = await broken_suite("kvstore", store[1], ("K1", "K2", "K5", "K9", "K10", "K18", "K19", "K20"), BROKEN[clause_id],
                                 nats=nats.url)
    assert_fails_only(results, clause_id)


async def test_a_store_without_lookup_chains_skips_only_k19(store, nats) -> None:  # noqa: ANN001
    absent = {"absent": frozenset({"KvStore/LookupChains"})}
    results = await broken_suite("kvstore", store[1], ("K1", "K2", "K7", "K19"), absent, nats=nats.url)
    assert_conforms(results, skipped={"K19"})
    assert "no LookupChains" in results["K19"].detail


async def test_a_store_without_runs_skips_only_k20(store, nats) -> None:  # noqa: ANN001
    older = {"requests": {"KvStore/Put": _run_as_empty}}
    results = await broken_suite("kvstore", store[1], ("K1", "K2", "K18", "K20"), older, nats=nats.url)
    assert_conforms(results, skipped={"K20"})
    assert "no KvBlockRun" in results["K20"].detail


async def test_slow_heartbeat_fails_k13(nats, tmp_path) -> None:  # noqa: ANN001
    slow, endpoint = start_store(nats.url, tmp_path / "slow.log", KVMESH_KVSTORE_HEARTBEAT_INTERVAL_S="3")
    try:
        assert_fails_only(await suite("kvstore", endpoint, nats=nats.url, only=("K1", "K13")), "K13")
    finally:
        slow.stop()


async def test_cli_prints_a_line_per_clause_and_exits_by_outcome(store) -> None:  # noqa: ANN001
    async def conform(*args: str) -> tuple[int, str]:
        proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "kvmesh", "conform", "kvstore", *args,
                                                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        out, _ = await proc.communicate()
        return proc.returncode, out.decode()

    code, out = await conform(store[1], "--only", "K1", "--only", "K2")
    assert code == 0 and out.splitlines()[:2] == [line for line in out.splitlines() if line.startswith("PASS")], out
    code, out = await conform(f"127.0.0.1:{free_port()}", "--only", "K1", "--clause-timeout", "10")
    assert code == 1 and out.startswith("FAIL K1"), out


async def test_lease_pins_a_full_store(nats, tmp_path) -> None:  # noqa: ANN001
    small, endpoint = start_store(nats.url, tmp_path / "small.log", KVMESH_KVSTORE_MEMORY_BYTES=str(STORE_BYTES))
    try:
        assert_conforms(await suite("kvstore", endpoint, only=("K1", "K16"), store_bytes=STORE_BYTES))
    finally:
        small.stop()


async def test_kvstore_conforms(store, nats) -> None:  # noqa: ANN001
    service, endpoint = store
    results = await suite("kvstore", endpoint, nats=nats.url, drain_pid=service.pid)
    assert_conforms(results, skipped={"K16"})   # K16 fills the store: test_lease_pins_a_full_store
    assert len(results) == len(REGISTRY.clauses)

