"""API keys and the per-key concurrency limit."""

from __future__ import annotations

import grpc
import pytest

from kvmesh.gateway.auth import ApiKeys, KeyLimiter
from kvmesh.gateway.generation import api_error_from_grpc, retry_after_from
from kvmesh.gateway.config import GatewaySettings
from kvmesh.gateway.errors import ApiError


def test_no_keys_means_no_auth() -> None:
    assert ApiKeys().check(None) == ""


@pytest.mark.parametrize("header", [None, "", "Bearer", "Basic k1", "Bearer wrong"])
def test_bad_credentials_are_401(header: str | None) -> None:
    with pytest.raises(ApiError) as info:
        ApiKeys(frozenset({"k1"})).check(header)
    assert (info.value.status, info.value.code) == (401, "invalid_api_key")


def test_good_key_is_returned() -> None:
    assert ApiKeys(frozenset({"k1", "k2"})).check("Bearer k2") == "k2"
    assert GatewaySettings(api_keys=" a, b ,").api_key_set() == frozenset({"a", "b"})


def test_api_keys_come_from_the_mesh_wide_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVMESH_API_KEYS", "secret")
    assert GatewaySettings().api_key_set() == frozenset({"secret"})


def test_limiter_counts_per_key() -> None:
    limiter = KeyLimiter(limit=1)
    limiter.acquire("a")
    limiter.acquire("b")
    with pytest.raises(ApiError) as info:
        limiter.acquire("a")
    assert (info.value.status, info.value.headers()) == (429, {"Retry-After": "1"})
    limiter.release("a")
    limiter.acquire("a")
    assert limiter.inflight == {"a": 1, "b": 1}
    unlimited = KeyLimiter(limit=0)
    for _ in range(100):
        unlimited.acquire("")


def test_grpc_errors_map_to_http() -> None:
    assert api_error_from_grpc(grpc.StatusCode.INVALID_ARGUMENT, "bad").status == 400
    busy = api_error_from_grpc(grpc.StatusCode.RESOURCE_EXHAUSTED, "full", 0.2)
    assert (busy.status, busy.headers()) == (429, {"Retry-After": "1"})
    assert api_error_from_grpc(grpc.StatusCode.UNAVAILABLE, "none").status == 503
    assert api_error_from_grpc(grpc.StatusCode.DEADLINE_EXCEEDED, "").status == 504
    assert retry_after_from((("retry-after", "2.5"),)) == 2.5
    assert retry_after_from((("retry-after", "soon"),)) is None
    assert retry_after_from(None) is None
