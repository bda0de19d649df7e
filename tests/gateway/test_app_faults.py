"""Client disconnects abort downstream work; a decode worker failing mid-stream is survived."""

from __future__ import annotations

import asyncio
import json

import grpc
import openai
import pytest

from .conftest import RunningGateway, eventually, run_gateway
from .fakes import FakeMesh, expected_text

BODY = {"model": "tiny", "prompt": "hi", "max_tokens": 10}


def stream_text(raw: str) -> str:
    payloads = [e[len("data: ") :] for e in raw.split("\n\n") if e.startswith("data: ")]
    assert payloads[-1] == "[DONE]"
    return "".join(c["choices"][0]["text"] for c in map(json.loads, payloads[:-1]) if c.get("choices"))


async def test_stream_disconnect_aborts_the_worker_and_releases_the_route(gateway: RunningGateway, mesh: FakeMesh) -> None:
    decode = mesh.decodes[0]
    decode.delay_s = 0.05
    async with gateway.client() as client:
        async with client.stream("POST", "/v1/completions", json=BODY | {"max_tokens": 1000, "stream": True}) as resp:
            assert (await anext(resp.aiter_lines())).startswith("data: ")
    await eventually(lambda: mesh.scheduler.statuses() == ["aborted"])
    rid = mesh.scheduler.routes[0].request_id
    assert decode.aborts == [rid]
    await eventually(lambda: decode.cancelled == [rid])


async def test_non_stream_disconnect_aborts_the_worker(gateway: RunningGateway, mesh: FakeMesh) -> None:
    decode = mesh.decodes[0]
    decode.delay_s = 0.05
    async with gateway.client() as client:
        request = asyncio.create_task(client.post("/v1/completions", json=BODY | {"max_tokens": 1000}))
        await eventually(lambda: decode.requests)
        request.cancel()  # the client goes away mid-generation
        with pytest.raises(asyncio.CancelledError):
            await request
    await eventually(lambda: mesh.scheduler.statuses() == ["aborted"])
    assert decode.aborts == [mesh.scheduler.routes[0].request_id]


@pytest.mark.parametrize("code", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED])
async def test_stream_migrates_when_the_worker_fails(gateway: RunningGateway, mesh: FakeMesh, code: grpc.StatusCode) -> None:
    first, second = mesh.decodes
    first.fail_after, first.fail_code = 4, code
    async with gateway.client() as client:
        resp = await client.post("/v1/completions", json=BODY | {"stream": True, "stream_options": {"include_usage": True}})
    assert stream_text(resp.text) == expected_text(3, 10)  # nothing lost, nothing twice
    usage = json.loads(resp.text.split("\n\n")[-3][len("data: ") :])["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (3, 10)
    retry = mesh.scheduler.routes[1]
    assert list(retry.exclude_workers) == ["decode-0"] and retry.num_prompt_tokens == 7 and retry.max_tokens == 6
    moved = second.requests[0]
    assert list(moved.prompt_token_ids) == [256, 104, 105] + [ord(c) for c in expected_text(3, 4)]
    assert moved.sampling.max_tokens == 6 and moved.request_id == mesh.scheduler.routes[0].request_id
    assert mesh.scheduler.statuses() == ["error", "ok"]


async def test_non_stream_survives_a_worker_process_dying(gateway: RunningGateway, mesh: FakeMesh) -> None:
    mesh.decodes[0].die_after = 3
    client = openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0)
    reply = await client.completions.create(model="tiny", prompt="hi", max_tokens=10)
    await client.close()
    assert reply.choices[0].text == expected_text(3, 10)
    assert reply.usage.completion_tokens == 10
    assert mesh.scheduler.statuses() == ["error", "ok"]


async def test_migrations_exhausted_streams_an_error_event_then_done(mesh: FakeMesh) -> None:
    for d in mesh.decodes:
        d.fail_after = 2
    await mesh.add_decode("decode-2")
    mesh.decodes[2].fail_after = 2
    async with run_gateway(mesh, max_migrations=1) as gw, gw.client() as client:
        resp = await client.post("/v1/completions", json=BODY | {"stream": True})
    events = resp.text.split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""]
    error = json.loads(events[-3][len("data: ") :])["error"]
    assert error["code"] == "worker_failed" and error["type"] == "server_error"
    assert stream_text(resp.text) == expected_text(3, 4)  # two tokens from each of two workers
    assert mesh.scheduler.statuses() == ["error", "error"]
    assert mesh.decodes[2].requests == []


async def test_client_gone_while_routing_still_releases_the_route(gateway: RunningGateway, mesh: FakeMesh) -> None:
    mesh.scheduler.gate = gate = asyncio.Event()
    async with gateway.client() as client:
        request = asyncio.create_task(client.post("/v1/completions", json=BODY))
        await eventually(lambda: mesh.scheduler.routes)
        request.cancel()
        with pytest.raises(asyncio.CancelledError):
            await request
    await eventually(lambda: mesh.scheduler.statuses() == ["aborted"])
    gate.set()


async def test_migrations_exhausted_non_stream_is_503(mesh: FakeMesh) -> None:
    for d in mesh.decodes:
        d.fail_after = 1
    async with run_gateway(mesh, max_migrations=2) as gw, gw.client() as client:
        resp = await client.post("/v1/completions", json=BODY)
    # the third attempt finds no worker left to try
    assert resp.status_code == 503 and resp.json()["error"]["code"] == "service_unavailable"
    assert len(mesh.scheduler.routes) == 3


async def test_a_character_split_across_tokens_and_a_migration_is_whole(gateway: RunningGateway, mesh: FakeMesh) -> None:
    target = list("xé日本y".encode())  # 10 byte-level tokens; é's two bytes end up on two workers
    first, second = mesh.decodes
    first.next_token = second.next_token = lambda ids: target[len(ids) - 3]
    first.fail_after = 2
    async with gateway.client() as client:
        resp = await client.post("/v1/completions", json=BODY | {"stream": True})
    assert stream_text(resp.text) == "xé日本y"
    assert "\ufffd" not in resp.text and len(mesh.scheduler.routes) == 2


async def test_lost_finish_after_the_last_token_needs_no_migration(gateway: RunningGateway, mesh: FakeMesh) -> None:
    mesh.decodes[0].drop_finish = True
    async with gateway.client() as client:
        resp = await client.post("/v1/completions", json=BODY)
    choice = resp.json()["choices"][0]
    assert (choice["text"], choice["finish_reason"]) == (expected_text(3, 10), "length")
    assert resp.json()["usage"]["completion_tokens"] == 10
    assert len(mesh.scheduler.routes) == 1 and mesh.scheduler.statuses() == ["error"]
