"""Our decode worker passes `kvmesh conform decode` (one process, every clause D1..), with the
suite's recording KV store as its hand-back target; a proxy that breaks one rule fails the
intended clause."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kvmesh.conform.decode import REGISTRY
from kvmesh.runtime.launcher import free_port

from .breaker import changed
from .conftest import Service, assert_conforms, assert_fails_only, broken_suite, suite

DRAIN = REGISTRY.clauses[-1].id   # SIGTERMs the worker: runs last


@pytest.fixture(scope="module", params=["engine thread", "engine process"])
def worker(request, nats, tmp_path_factory) -> Iterator[tuple[Service, str, int]]:  # noqa: ANN001
    """The decode worker, with its engine on a thread (the default) and in its own process."""
    port, store_port = free_port(), free_port()
    service = Service("decode", ["--port", str(port), "--metrics-port", "-1", "--worker-id", "decode-conform",
                                 "--torch-threads", "1", "--kvstore", f"127.0.0.1:{store_port}"],
                      {"KVMESH_NATS_URL": nats.url, "KVMESH_DECODE_PREFILL_TIMEOUT_S": "5",
                       "KVMESH_DECODE_ENGINE_PROCESS": str(request.param == "engine process").lower()},
                      tmp_path_factory.mktemp("decode") / "decode.log")
    service.wait_grpc(f"127.0.0.1:{port}")
    yield service, f"127.0.0.1:{port}", store_port
    service.stop()


async def test_decode_conforms(worker, nats) -> None:  # noqa: ANN001
    # NOTE: first, while the worker's channel to the hand-back store is fresh (D12): a store that
    # came and went between suite runs leaves that channel in reconnect backoff for seconds.
    service, endpoint, store_port = worker
    every = tuple(c.id for c in REGISTRY.clauses if c.id != DRAIN)
    results = await suite("decode", endpoint, nats=nats.url, kvstore_port=store_port, only=every)
    assert_conforms(results)
    assert len(results) == len(REGISTRY.clauses) - 1


def _no_usage(reply):  # noqa: ANN001, ANN202
    out = changed(reply)
    out.ClearField("usage")
    return out


def _no_cached_tokens(reply):  # noqa: ANN001, ANN202
    out = changed(reply)
    if out.HasField("usage"):
        out.usage.cached_tokens = 0
    return out


BROKEN = {
    "D2": {"replies": {"DecodeWorker/Generate": _no_usage}},
    "D6": {"replies": {"DecodeWorker/Abort": lambda r: changed(r, found=False)}},
    # a worker that never serves a pushed prompt from its cache (reports no cached tokens)
    "D22": {"replies": {"DecodeWorker/Generate": _no_cached_tokens}},
}
ONLY = {"D22": ("D1", "D2", "D22")}


def kv_spec() -> str:
    """--kv-spec of the fixture's worker (default settings), so the broken D22 case need not wait
    for a hand-back through the store channel earlier sessions left in reconnect backoff."""
    from kvmesh.decode.config import DecodeSettings  # noqa: PLC0415
    from kvmesh.engine.config import ModelArgs  # noqa: PLC0415
    from kvmesh.engine.tiny import resolve_model  # noqa: PLC0415
    from kvmesh.runtime.blockhash import resolve_dtype  # noqa: PLC0415

    settings = DecodeSettings()
    args = ModelArgs.from_dir(resolve_model(settings.model))
    dtype = resolve_dtype(settings.dtype, args.torch_dtype)
    return f"{settings.served_model_name()},{dtype},{args.num_layers},{args.num_kv_heads},{args.head_dim}"


@pytest.mark.parametrize("clause_id", sorted(BROKEN))
async def test_broken_decode_fails_the_clause(worker, clause_id: str) -> None:  # noqa: ANN001
    spec = {"kv_spec": kv_spec()} if clause_id == "D22" else {}
    results = await broken_suite("decode", worker[1], ONLY.get(clause_id, ("D1", "D2", "D6")), BROKEN[clause_id],
                                 kvstore_port=worker[2], **spec)
    assert_fails_only(results, clause_id)


async def test_decode_drains(worker, nats) -> None:  # noqa: ANN001
    service, endpoint, _ = worker
    assert_conforms(await suite("decode", endpoint, nats=nats.url, drain_pid=service.pid, only=("D1", DRAIN)))
