"""Every failure answers with OpenAI error JSON and the right status - never a 500 for bad input."""

from __future__ import annotations

import grpc
import openai
import pytest

from .conftest import RunningGateway, eventually, run_gateway
from .fakes import FakeMesh, RouteError


def error_of(resp) -> dict:
    body = resp.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]


async def test_malformed_json_is_400(gateway: RunningGateway) -> None:
    async with gateway.client() as client:
        resp = await client.post("/v1/completions", content=b'{"model": "tiny",', headers={"content-type": "application/json"})
    assert resp.status_code == 400
    err = error_of(resp)
    assert err["type"] == "invalid_request_error" and err["code"] == "invalid_json"


async def test_unknown_model_is_404(gateway: RunningGateway, mesh: FakeMesh) -> None:
    async with gateway.client() as client:
        resp = await client.post("/v1/chat/completions", json={"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]})
    assert resp.status_code == 404
    assert error_of(resp) == {
        "message": "The model `gpt-9` does not exist.",
        "type": "invalid_request_error",
        "param": "model",
        "code": "model_not_found",
    }
    assert mesh.scheduler.routes == []


@pytest.mark.parametrize("value", [0, -1])
async def test_max_tokens_below_one_is_400(gateway: RunningGateway, value: int) -> None:
    async with gateway.client() as client:
        resp = await client.post("/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": value})
    assert resp.status_code == 400
    err = error_of(resp)
    assert (err["message"], err["param"]) == (f"max_tokens must be at least 1, got {value}.", "max_tokens")


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "tiny", "prompt": "x", "max_tokens": "5"}, "max_tokens"),
        ({"model": "tiny", "prompt": 5}, "prompt"),
        ({"model": "tiny"}, "prompt"),
        ({"model": "tiny", "prompt": "x", "temperature": "hot"}, "temperature"),
        ({"model": "tiny", "prompt": "x", "stream": "yes"}, "stream"),
        ({"model": "tiny", "prompt": "x", "n": 99}, "n"),
        ({"model": "tiny", "prompt": "x", "best_of": 3}, "best_of"),
        ({"model": "tiny", "prompt": "x", "priority": "high"}, "priority"),
        ({"model": "tiny", "prompt": "x", "logit_bias": {"99999": 5}}, "logit_bias"),
        ({"model": "tiny", "prompt": "x", "presence_penalty": 3}, "presence_penalty"),
        ({"model": "tiny", "prompt": "x", "suffix": "y"}, "suffix"),
        ({"model": "tiny", "prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ],
)
async def test_bad_completion_fields_are_400_naming_the_param(gateway: RunningGateway, body: dict, param: str) -> None:
    async with gateway.client() as client:
        resp = await client.post("/v1/completions", json=body)
    assert resp.status_code == 400
    assert error_of(resp)["param"] == param


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice"),
        ({"response_format": {"type": "json_schema", "json_schema": {"schema": 5}}}, "response_format.json_schema.schema"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "messages.[0].content.[0].type"),
        ({"messages": [{"role": "user"}]}, "messages.[0].content"),
        ({"messages": [{"content": "x"}]}, "messages.[0].role"),
    ],
)
async def test_bad_chat_fields_are_400_naming_the_param(gateway: RunningGateway, extra: dict, param: str) -> None:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]} | extra
    async with gateway.client() as client:
        resp = await client.post("/v1/chat/completions", json=body)
    assert resp.status_code == 400
    assert error_of(resp)["param"] == param


async def test_over_context_is_400_with_vllm_message(mesh: FakeMesh) -> None:
    async with run_gateway(mesh, max_model_len=10) as gw, gw.client() as client:
        with_max = await client.post("/v1/completions", json={"model": "tiny", "prompt": "hello", "max_tokens": 8})
        prompt_only = await client.post("/v1/completions", json={"model": "tiny", "prompt": "hello world"})
    assert with_max.status_code == 400
    assert error_of(with_max)["message"] == (
        "This model's maximum context length is 10 tokens. However, you requested 14 tokens "
        "(6 in the messages, 8 in the completion). Please reduce the length of the messages or completion."
    )
    assert error_of(prompt_only)["message"] == (
        "This model's maximum context length is 10 tokens. However, your request has 12 input tokens. "
        "Please reduce the length of the input messages."
    )
    assert error_of(prompt_only)["code"] == "context_length_exceeded"
    assert mesh.scheduler.routes == []


async def test_body_over_limit_is_413(mesh: FakeMesh) -> None:
    async with run_gateway(mesh, max_body_bytes=100) as gw, gw.client() as client:
        resp = await client.post("/v1/completions", json={"model": "tiny", "prompt": "x" * 200})
    assert resp.status_code == 413 and error_of(resp)["code"] == "request_too_large"


async def test_api_keys_require_bearer_auth(mesh: FakeMesh) -> None:
    async with run_gateway(mesh, api_keys="k1, k2") as gw:
        async with gw.client() as client:
            missing = await client.post("/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 1})
            wrong = await client.get("/v1/models", headers={"Authorization": "Bearer nope"})
            health = await client.get("/health")
        api = openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="k2")
        ok = await api.completions.create(model="tiny", prompt="x", max_tokens=1)
        await api.close()
    assert missing.status_code == 401 and error_of(missing)["code"] == "invalid_api_key"
    assert wrong.status_code == 401 and error_of(wrong)["message"] == "Incorrect API key provided."
    assert health.status_code == 200
    assert ok.usage.completion_tokens == 1


async def test_scheduler_resource_exhausted_is_429_with_retry_after(gateway: RunningGateway, mesh: FakeMesh) -> None:
    mesh.scheduler.error = RouteError(grpc.StatusCode.RESOURCE_EXHAUSTED, "admission queue full", retry_after="2.5")
    async with gateway.client() as client:
        resp = await client.post("/v1/completions", json={"model": "tiny", "prompt": "x", "stream": True})
    assert resp.status_code == 429 and resp.headers["retry-after"] == "3"
    assert error_of(resp)["message"] == "admission queue full"
    assert mesh.scheduler.completes == []  # nothing was routed, nothing to release


async def test_no_worker_is_503(gateway: RunningGateway, mesh: FakeMesh) -> None:
    mesh.scheduler.workers.clear()
    async with gateway.client() as client:
        resp = await client.post("/v1/completions", json={"model": "tiny", "prompt": "x"})
    assert resp.status_code == 503 and error_of(resp)["type"] == "server_error"


async def test_scheduler_down_is_503_and_unhealthy() -> None:
    async with run_gateway(None, scheduler="127.0.0.1:9") as gw, gw.client() as client:
        resp = await client.post("/v1/completions", json={"model": "tiny", "prompt": "x"})
        health = await client.get("/health")
    assert resp.status_code == 503 and error_of(resp)["code"] == "service_unavailable"
    assert health.status_code == 503


async def test_decode_invalid_argument_is_400(gateway: RunningGateway, mesh: FakeMesh) -> None:
    mesh.decodes[0].error = (grpc.StatusCode.INVALID_ARGUMENT, "prompt too long for this worker")
    async with gateway.client() as client:
        resp = await client.post("/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 2})
    assert resp.status_code == 400 and error_of(resp)["message"] == "prompt too long for this worker"
    assert mesh.scheduler.statuses() == ["error"]


async def test_unknown_route_is_json_404(gateway: RunningGateway) -> None:
    async with gateway.client() as client:
        resp = await client.get("/v1/nothing")
    assert resp.status_code == 404 and error_of(resp)["code"] == "not_found"


async def test_per_key_concurrency_limit_is_429(mesh: FakeMesh) -> None:
    mesh.decodes[0].delay_s = 0.05
    async with run_gateway(mesh, max_concurrent_streams_per_key=1) as gw, gw.client() as client:
        body = {"model": "tiny", "prompt": "x", "max_tokens": 1000, "stream": True}
        async with client.stream("POST", "/v1/completions", json=body) as first:
            await anext(first.aiter_lines())
            second = await client.post("/v1/completions", json=body | {"max_tokens": 1})
        assert second.status_code == 429 and "at most 1" in error_of(second)["message"]
        await eventually(lambda: not gw.app.state.service.limiter.inflight)  # the first stream's client left
        third = await client.post("/v1/completions", json=body | {"max_tokens": 1, "stream": False})
    assert third.status_code == 200


async def test_completion_paths_outside_post_still_answer_like_the_other_routes(gateway: RunningGateway) -> None:
    """The completion routes' POSTs skip FastAPI's router (fastpath.CompletionRoutes); everything
    else on those paths still goes through it, and both kinds are counted under the route's path."""
    async with gateway.client() as client:
        wrong_method = await client.get("/v1/chat/completions")
        bad = await client.post("/v1/chat/completions", content=b"[", headers={"content-type": "application/json"})
        schema = (await client.get("/openapi.json")).json()
        metrics = (await client.get("/metrics")).text
    assert wrong_method.status_code == 405 and error_of(wrong_method)["code"] == "method_not_allowed"
    assert bad.status_code == 400 and error_of(bad)["code"] == "invalid_json"
    assert bad.headers["x-request-id"].startswith("chatcmpl-")
    assert {"/v1/completions", "/v1/chat/completions"} <= set(schema["paths"])
    assert "requestBody" in schema["paths"]["/v1/chat/completions"]["post"]
    assert 'kvmesh_gateway_requests_total{route="/v1/chat/completions",status="400"} 1.0' in metrics
    assert 'kvmesh_gateway_requests_total{route="/v1/chat/completions",status="405"} 1.0' in metrics
