"""The OpenAI surface end to end through the app: completions and chat, streaming and not."""

from __future__ import annotations

import asyncio
import json

import openai

from .conftest import RunningGateway, run_gateway
from .fakes import FakeMesh, expected_text

PROMPT = "hi"  # tiny: [<|bos|>, 'h', 'i'] = 3 tokens


def sse_payloads(raw: str) -> list[str]:
    assert raw.endswith("data: [DONE]\n\n")
    events = raw.split("\n\n")[:-1]
    assert all(e.startswith("data: ") for e in events)
    return [e[len("data: ") :] for e in events]


async def test_completion_returns_text_usage_and_request_id(gateway: RunningGateway, mesh: FakeMesh) -> None:
    async with gateway.client() as client:
        resp = await client.post("/v1/completions", json={"model": "tiny", "prompt": PROMPT, "max_tokens": 5})
    assert resp.status_code == 200
    body = resp.json()
    assert body["object"] == "text_completion"
    assert body["id"].startswith("cmpl-") and resp.headers["x-request-id"] == body["id"]
    assert body["choices"] == [{"index": 0, "text": expected_text(3, 5), "logprobs": None, "finish_reason": "length"}]
    assert body["usage"] == {
        "prompt_tokens": 3,
        "completion_tokens": 5,
        "total_tokens": 8,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    route = mesh.scheduler.routes[0]
    assert (route.request_id, route.model, route.num_prompt_tokens, route.max_tokens) == (body["id"], "tiny", 3, 5)
    gen = mesh.decodes[0].requests[0]
    assert list(gen.prompt_token_ids) == [256, 104, 105] and gen.sampling.max_tokens == 5
    assert mesh.scheduler.statuses() == ["ok"]


async def test_request_id_and_session_pass_downstream(gateway: RunningGateway, mesh: FakeMesh) -> None:
    headers = {"X-Request-Id": "abc-123", "X-Session-Id": "conv-9"}
    async with gateway.client() as client:
        resp = await client.post("/v1/completions", headers=headers, json={"model": "tiny", "prompt": PROMPT, "max_tokens": 2})
    assert resp.headers["x-request-id"] == "abc-123"  # echoed for correlation
    mesh_id = resp.json()["id"]
    assert mesh_id.startswith("cmpl-") and "abc-123" not in mesh_id
    assert mesh.scheduler.routes[0].request_id == mesh_id and mesh.scheduler.routes[0].session_id == "conv-9"
    assert mesh.decodes[0].requests[0].request_id == mesh_id and mesh.decodes[0].requests[0].session_id == "conv-9"


async def test_two_clients_sending_one_x_request_id_get_distinct_mesh_ids(gateway: RunningGateway, mesh: FakeMesh) -> None:
    """A client's X-Request-Id never keys the mesh: the scheduler would take the second for a retry
    of the first and free its admission slot."""
    async with gateway.client() as client:
        for _ in range(2):
            resp = await client.post("/v1/completions", headers={"X-Request-Id": "same"},
                                     json={"model": "tiny", "prompt": PROMPT, "max_tokens": 2})
            assert resp.status_code == 200 and resp.headers["x-request-id"] == "same"
    first, second = (r.request_id for r in mesh.scheduler.routes)
    assert first != second and "same" not in first + second


async def test_user_field_alone_makes_no_session_unless_configured(gateway: RunningGateway, mesh: FakeMesh) -> None:
    """An app sending one constant `user` must not pin all of its traffic to one worker by default."""
    async with gateway.client() as client:
        await client.post("/v1/completions", json={"model": "tiny", "prompt": PROMPT, "max_tokens": 1, "user": "alice"})
    assert mesh.scheduler.routes[0].session_id == ""


async def test_user_field_is_the_session_when_configured(mesh: FakeMesh) -> None:
    async with run_gateway(mesh, session_from_user=True) as gw, gw.client() as client:
        await client.post("/v1/completions", json={"model": "tiny", "prompt": PROMPT, "max_tokens": 1, "user": "alice"})
    assert mesh.scheduler.routes[0].session_id == "alice"


async def test_block_hashes_cover_full_prompt_blocks(gateway: RunningGateway, mesh: FakeMesh) -> None:
    prompt = list(range(40))
    async with gateway.client() as client:
        await client.post("/v1/completions", json={"model": "tiny", "prompt": prompt, "max_tokens": 1})
    route = mesh.scheduler.routes[0]
    assert list(route.block_hashes) == gateway.model.hasher.hashes(prompt) and len(route.block_hashes) == 2


async def test_default_max_tokens_is_capped_by_setting_and_context(mesh: FakeMesh) -> None:
    async with run_gateway(mesh, default_max_tokens=7, max_model_len=12) as gw, gw.client() as client:
        short = await client.post("/v1/completions", json={"model": "tiny", "prompt": "hi"})
        long = await client.post("/v1/completions", json={"model": "tiny", "prompt": "hello wor"})
    assert short.json()["usage"]["completion_tokens"] == 7  # min(12 - 3, 7)
    assert long.json()["usage"]["completion_tokens"] == 2  # min(12 - 10, 7)


async def test_sampling_reaches_the_decode_worker(gateway: RunningGateway, mesh: FakeMesh) -> None:
    body = {
        "model": "tiny", "prompt": PROMPT, "max_tokens": 3, "temperature": 0.5, "top_p": 0.9, "top_k": 40,
        "seed": 7, "stop": ["\n", "END"], "stop_token_ids": [257], "ignore_eos": True,
    }
    async with gateway.client() as client:
        assert (await client.post("/v1/completions", json=body)).status_code == 200
    s = mesh.decodes[0].requests[0].sampling
    assert (round(s.temperature, 3), round(s.top_p, 3), s.top_k, s.seed, s.max_tokens) == (0.5, 0.9, 40, 7, 3)
    assert (list(s.stop), list(s.stop_token_ids), s.ignore_eos, s.HasField("logprobs")) == (["\n", "END"], [257], True, False)


async def test_stream_framing_ends_with_done(gateway: RunningGateway) -> None:
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 3, "stream": True}
    async with gateway.client() as client:
        resp = await client.post("/v1/completions", json=body)
    assert resp.headers["content-type"].startswith("text/event-stream")
    payloads = sse_payloads(resp.text)
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == expected_text(3, 3)
    reasons = [c["choices"][0]["finish_reason"] for c in chunks]  # tokens may coalesce into fewer chunks
    assert reasons[-1] == "length" and set(reasons[:-1]) <= {None}
    assert all("usage" not in c for c in chunks)


async def test_stream_include_usage_sends_a_final_usage_chunk(gateway: RunningGateway) -> None:
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 3, "stream": True, "stream_options": {"include_usage": True}}
    async with gateway.client() as client:
        resp = await client.post("/v1/completions", json=body)
    chunks = [json.loads(p) for p in sse_payloads(resp.text)[:-1]]
    assert all(c["usage"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] == 6


async def test_openai_client_streams_chat_with_usage(gateway: RunningGateway) -> None:
    client = openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key="unused")
    stream = await client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [c async for c in stream]
    await client.close()
    assert chunks[0].choices[0].delta.role == "assistant"
    # <|bos|><|user|>hi<|end|><|assistant|> = 6 tokens
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected_text(6, 4)
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens == 6 and chunks[-1].usage.completion_tokens == 4


async def test_openai_client_chat_non_stream(gateway: RunningGateway, mesh: FakeMesh) -> None:
    mesh.decodes[0].cached_tokens = 4
    client = openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key="unused")
    reply = await client.chat.completions.create(
        model="tiny",
        messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        max_completion_tokens=3,
    )
    await client.close()
    assert reply.object == "chat.completion" and reply.id.startswith("chatcmpl-")
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.prompt_tokens_details.cached_tokens == 4
    prompt = gateway.model.tokenizer.encode("<|system|>be brief<|end|><|user|>hi<|end|><|assistant|>")
    assert list(mesh.decodes[0].requests[0].prompt_token_ids) == prompt
    assert reply.choices[0].message.content == expected_text(len(prompt), 3)


async def test_openai_client_completion_logprobs(gateway: RunningGateway) -> None:
    client = openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key="unused")
    reply = await client.completions.create(model="tiny", prompt=PROMPT, max_tokens=2, logprobs=2)
    await client.close()
    lp = reply.choices[0].logprobs
    assert lp.tokens == list(expected_text(3, 2)) and lp.token_logprobs == [-0.5, -0.5]
    assert lp.top_logprobs[0] == {"d": -0.5, "e": -1.5} and lp.text_offset == [0, 1]


async def test_chat_logprobs_with_top_logprobs(gateway: RunningGateway) -> None:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "logprobs": True, "top_logprobs": 1}
    async with gateway.client() as client:
        resp = await client.post("/v1/chat/completions", json=body)
    content = resp.json()["choices"][0]["logprobs"]["content"]
    tok = expected_text(6, 1)
    assert content == [
        {"token": tok, "logprob": -0.5, "bytes": [ord(tok)], "top_logprobs": [{"token": tok, "logprob": -0.5, "bytes": [ord(tok)]}]}
    ]


async def test_models_health_and_metrics(gateway: RunningGateway) -> None:
    async with gateway.client() as client:
        models = (await client.get("/v1/models")).json()
        one = await client.get("/v1/models/tiny")
        health = await client.get("/health")
        await client.post("/v1/completions", json={"model": "tiny", "prompt": PROMPT, "max_tokens": 2})
        metrics = (await client.get("/metrics")).text
    assert [m["id"] for m in models["data"]] == ["tiny"] and models["data"][0]["max_model_len"] == 2048
    assert one.json()["id"] == "tiny"
    assert health.status_code == 200
    assert 'kvmesh_gateway_event_loop_lag_seconds_bucket{le="+Inf"}' in metrics
    for name in (
        'kvmesh_gateway_requests_total{route="/v1/completions",status="200"} 1.0',
        "kvmesh_gateway_inflight_requests 0.0",
        "kvmesh_gateway_ttft_seconds_count 1.0",
        "kvmesh_gateway_tpot_seconds_count 1.0",
        "kvmesh_gateway_inter_token_seconds_count 1.0",
        "kvmesh_gateway_e2e_seconds_count 1.0",
        "kvmesh_gateway_prompt_tokens_total 3.0",
        "kvmesh_gateway_completion_tokens_total 2.0",
        "kvmesh_gateway_mirror_published_total 0.0",
        "kvmesh_gateway_mirror_dropped_total 0.0",
    ):
        assert name in metrics, name


async def test_a_stream_sends_the_role_with_the_first_token_and_the_last_token_with_its_end(gateway: RunningGateway) -> None:
    """One write a delta, and none for what follows at once: the role chunk goes with the first
    token, the finish with the usage chunk and [DONE] (ASGI body messages, as uvicorn writes them)."""
    body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions", "query_string": b"", "root_path": "",
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80), "state": {}}
    incoming = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict] = []

    async def receive() -> dict:
        if incoming:
            return incoming.pop(0)
        await asyncio.Event().wait()
        return {}

    async def send(message: dict) -> None:
        sent.append(message)

    await gateway.app(scope, receive, send)
    writes = [m["body"] for m in sent if m["type"] == "http.response.body" and m["body"]]
    payloads = [[e.removeprefix("data: ") for e in w.decode().split("\n\n") if e] for w in writes]
    events = [[json.loads(p) if p != "[DONE]" else p for p in w] for w in payloads]
    assert "role" in events[0][0]["choices"][0]["delta"] and events[0][-1]["choices"][0]["delta"]["content"]
    assert events[-1][-1] == "[DONE]" and events[-1][-2]["usage"]["completion_tokens"] == 3
    assert events[-1][-3]["choices"][0]["finish_reason"] == "length"
    assert all(sum(1 for e in w if e != "[DONE]" and e["choices"] and e["choices"][0]["delta"].get("content")) == 1 for w in events)
