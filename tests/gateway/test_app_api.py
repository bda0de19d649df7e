"""The gateway's API additions against fake workers: tool calls (parsed, streamed), n choices,
echo, priority, /tokenize, /detokenize, /version, /health readiness."""

from __future__ import annotations

import asyncio
import json

from kvmesh.gateway.readiness import HEALTH_MAX_AGE_S

from .conftest import RunningGateway, run_gateway
from .fakes import FakeMesh, start_fake_mesh

TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
ASK = [{"role": "user", "content": "weather?"}]
HERMES = ["Checking. ", "<tool_", 'call>\n{"name": "get_weather", ', '"arguments": {"city": "Oslo"}}\n</tool_call>']


def sse_events(text: str) -> list[dict]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


async def test_auto_tool_call_is_parsed_from_hermes_output(mesh: FakeMesh, gateway: RunningGateway) -> None:
    for d in mesh.decodes:
        d.script = HERMES
    async with gateway.client() as client:
        body = (await client.post("/v1/chat/completions", json={"model": "tiny", "messages": ASK, "tools": [TOOL]})).json()
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] == "Checking."
    call = choice["message"]["tool_calls"][0]
    assert (call["type"], call["function"]) == ("function", {"name": "get_weather", "arguments": '{"city": "Oslo"}'})


async def test_streamed_tool_call_deltas_add_up_to_the_call(mesh: FakeMesh, gateway: RunningGateway) -> None:
    for d in mesh.decodes:
        d.script = HERMES
    async with gateway.client() as client:
        resp = await client.post("/v1/chat/completions", json={"model": "tiny", "messages": ASK, "tools": [TOOL], "stream": True})
    deltas = [e["choices"][0] for e in sse_events(resp.text)]
    content = "".join(c["delta"].get("content") or "" for c in deltas)
    calls = [tc for c in deltas for tc in c["delta"].get("tool_calls", [])]
    assert content == "Checking. " and "<tool" not in content
    assert [(tc["index"], tc["function"]["name"], json.loads(tc["function"]["arguments"])) for tc in calls] == [(0, "get_weather", {"city": "Oslo"})]
    assert deltas[-1]["finish_reason"] == "tool_calls"


async def test_malformed_tool_call_stays_content(mesh: FakeMesh, gateway: RunningGateway) -> None:
    for d in mesh.decodes:
        d.script = ["<tool_call>{", "broken"]
    async with gateway.client() as client:
        body = (await client.post("/v1/chat/completions", json={"model": "tiny", "messages": ASK, "tools": [TOOL]})).json()
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "<tool_call>{broken"}
    assert body["choices"][0]["finish_reason"] == "stop"


async def test_n_choices_have_their_indices_and_summed_usage(mesh: FakeMesh, gateway: RunningGateway) -> None:
    async with gateway.client() as client:
        body = (await client.post("/v1/completions", json={"model": "tiny", "prompt": "hi", "n": 3, "max_tokens": 2, "seed": 7})).json()
        stream = await client.post("/v1/completions", json={"model": "tiny", "prompt": "hi", "n": 2, "max_tokens": 2, "stream": True})
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 6, "total_tokens": 9, "prompt_tokens_details": {"cached_tokens": 0}}
    routes = mesh.scheduler.routes[:3]
    assert len({r.request_id for r in routes}) == 3 and len({r.session_id for r in routes}) == 1
    seeds = sorted(req.sampling.seed for d in mesh.decodes for req in d.requests[:3] if req.sampling.HasField("seed"))
    assert seeds == [7, 8, 9]
    finishes = [c for e in sse_events(stream.text) for c in e["choices"] if c["finish_reason"]]
    assert sorted(c["index"] for c in finishes) == [0, 1]


async def test_priority_from_field_or_header_reaches_route_and_sampling(mesh: FakeMesh, gateway: RunningGateway) -> None:
    async with gateway.client() as client:
        await client.post("/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 1, "priority": -3})
        await client.post("/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 1}, headers={"X-Request-Priority": "7"})
        bad = await client.post("/v1/completions", json={"model": "tiny", "prompt": "hi"}, headers={"X-Request-Priority": "soon"})
    assert [r.priority for r in mesh.scheduler.routes] == [-3, 7]
    assert sorted(req.sampling.priority for d in mesh.decodes for req in d.requests) == [-3, 7]
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "X-Request-Priority"


async def test_echo_puts_the_prompt_first(gateway: RunningGateway) -> None:
    async with gateway.client() as client:
        body = (await client.post("/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 2, "echo": True})).json()
    assert body["choices"][0]["text"].startswith("hi") and len(body["choices"][0]["text"]) == 4


async def test_tokenize_detokenize_version(gateway: RunningGateway) -> None:
    async with gateway.client() as client:
        tok = (await client.post("/tokenize", json={"prompt": "hi", "return_token_strs": True})).json()
        no_bos = (await client.post("/tokenize", json={"model": "tiny", "prompt": "hi", "add_special_tokens": False})).json()
        chat = (await client.post("/tokenize", json={"messages": ASK, "tools": [TOOL]})).json()
        detok = (await client.post("/detokenize", json={"tokens": [104, 105]})).json()
        both = await client.post("/tokenize", json={"prompt": "x", "messages": ASK})
        oov = await client.post("/detokenize", json={"tokens": [99999]})
        other = await client.post("/tokenize", json={"model": "gpt-9", "prompt": "x"})
        version = (await client.get("/version")).json()
    assert tok == {"count": 3, "max_model_len": 2048, "tokens": [256, 104, 105], "token_strs": ["<|bos|>", "h", "i"]}
    assert no_bos["tokens"] == [104, 105]
    assert chat["tokens"][-1] == 261 and chat["count"] == len(chat["tokens"])  # ends with <|assistant|>
    assert detok == {"prompt": "hi"}
    assert (both.status_code, oov.status_code, other.status_code) == (400, 400, 404)
    assert oov.json()["error"]["param"] == "tokens" and isinstance(version["version"], str)


async def health_within(client, seconds: float, status: int):  # noqa: ANN001, ANN201
    """/health's answer once it is `status`, or its last answer after `seconds`."""
    deadline = asyncio.get_running_loop().time() + seconds
    while (reply := await client.get("/health")).status_code != status and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.1)
    return reply


async def test_health_is_503_until_a_production_decode_worker_is_registered() -> None:
    mesh = await start_fake_mesh(num_decode=0)
    try:  # the first scheduler replica listed is down: the probe asks the next one (docs/replicas.md)
        async with run_gateway(mesh, scheduler=f"127.0.0.1:1,{mesh.scheduler_endpoint}") as gw, gw.client() as client:
            before = await client.get("/health")
            await mesh.add_decode("decode-0")
            after = await health_within(client, HEALTH_MAX_AGE_S + 1.0, 200)  # NOTE: the list it reads may be 1 s old
            mesh.scheduler.workers.clear()
            again = await health_within(client, HEALTH_MAX_AGE_S + 1.0, 503)
    finally:
        await mesh.stop()
    assert before.status_code == 503 and "no decode worker" in before.json()["reason"]
    assert after.status_code == 200 and again.status_code == 503
