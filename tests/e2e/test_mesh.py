"""The walking skeleton, end to end: a real mesh driven with the official openai client."""

from __future__ import annotations

import concurrent.futures
import json

import httpx
import openai
import pytest

pytestmark = pytest.mark.e2e

PROMPT_IDS = [72, 101, 108, 108, 111, 44, 32, 109, 101, 115, 104, 33] * 9  # 108 tokens: 6 full blocks + tail


@pytest.fixture(scope="module")
def reference():
    """Greedy output of the in-process engine on the same model, for the same prompt ids."""
    from kvmesh.engine.llm import EngineConfig, LLMEngine  # noqa: PLC0415
    from kvmesh.engine.sampling import SamplingParams  # noqa: PLC0415

    engine = LLMEngine(EngineConfig(model="tiny", dtype="float32"))

    def run(prompt_ids: list[int], max_tokens: int) -> list[int]:
        [done] = engine.generate([prompt_ids], SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
        return list(done.token_ids)

    return run


def test_completion_greedy_matches_in_process_engine_and_kv_crossed(mesh, reference):
    client = mesh.openai_client()
    received_before = mesh.metric("decode-0", "kvmesh_decode_kv_blocks_received_total")
    local_before = mesh.metric("decode-0", "kvmesh_decode_local_prefill_requests_total")
    remote_before = mesh.metric("decode-0", "kvmesh_decode_remote_prefill_requests_total")
    reply = client.completions.create(model="tiny", prompt=PROMPT_IDS, max_tokens=24, temperature=0,
                                      extra_body={"ignore_eos": True}, logprobs=None)
    expected = reference(PROMPT_IDS, 24)
    from kvmesh.engine.tiny import resolve_model  # noqa: PLC0415
    from kvmesh.engine.tokenizer import Tokenizer  # noqa: PLC0415

    tokenizer = Tokenizer.from_dir(resolve_model("tiny"))
    assert reply.choices[0].text == tokenizer.decode(expected)
    assert reply.usage.prompt_tokens == len(PROMPT_IDS)
    assert reply.usage.completion_tokens == 24
    assert reply.usage.total_tokens == len(PROMPT_IDS) + 24
    # KV crossed the process boundary: blocks arrived from the prefill worker, no local prefill.
    assert mesh.metric("decode-0", "kvmesh_decode_kv_blocks_received_total") - received_before >= 2
    assert mesh.metric("decode-0", "kvmesh_decode_remote_prefill_requests_total") - remote_before == 1
    assert mesh.metric("decode-0", "kvmesh_decode_local_prefill_requests_total") == local_before


def test_chat_non_streaming(mesh):
    reply = mesh.openai_client().chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Hi there"}], max_tokens=8, temperature=0)
    choice = reply.choices[0]
    assert choice.message.role == "assistant"
    assert choice.finish_reason in ("stop", "length")
    assert reply.usage.completion_tokens == 8 or choice.finish_reason == "stop"
    assert reply.id and reply.object == "chat.completion" and reply.model == "tiny"


def test_chat_streaming_with_usage_matches_non_streaming(mesh):
    client = mesh.openai_client()
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Count to three"}]
    whole = client.chat.completions.create(model="tiny", messages=messages, max_tokens=12, temperature=0)
    chunks = list(client.chat.completions.create(model="tiny", messages=messages, max_tokens=12, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == [] and usage_chunk.usage.completion_tokens == whole.usage.completion_tokens
    assert usage_chunk.usage.prompt_tokens == whole.usage.prompt_tokens
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason


def test_sse_framing_on_the_wire(mesh):
    body = {"model": "tiny", "prompt": "abc", "max_tokens": 5, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{mesh.base_url}/v1/completions", json=body, timeout=60) as reply:
        assert reply.status_code == 200
        assert reply.headers["content-type"].startswith("text/event-stream")
        raw = reply.read().decode()
    events = [e for e in raw.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    payloads = [json.loads(e[len("data: "):]) for e in events[:-1]]
    assert payloads[-1]["choices"] == [] and payloads[-1]["usage"]["completion_tokens"] == 5
    assert all(p["object"] == "text_completion" for p in payloads)


def test_request_id_passes_through(mesh):
    reply = httpx.post(f"{mesh.base_url}/v1/completions", headers={"X-Request-Id": "req-e2e-42"},
                       json={"model": "tiny", "prompt": "x", "max_tokens": 2}, timeout=60)
    assert reply.status_code == 200 and reply.headers["x-request-id"] == "req-e2e-42"


def test_eight_concurrent_streams_all_correct(mesh, reference):
    client = mesh.openai_client()
    prompts = [[65 + i] * (5 + 3 * i) for i in range(8)]

    def stream(prompt_ids: list[int]) -> list[str]:
        chunks = client.completions.create(model="tiny", prompt=prompt_ids, max_tokens=10, temperature=0,
                                           stream=True, extra_body={"ignore_eos": True})
        return "".join(c.choices[0].text for c in chunks if c.choices)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        texts = list(pool.map(stream, prompts))
    from kvmesh.engine.tiny import resolve_model  # noqa: PLC0415
    from kvmesh.engine.tokenizer import Tokenizer  # noqa: PLC0415

    tokenizer = Tokenizer.from_dir(resolve_model("tiny"))
    assert texts == [tokenizer.decode(reference(p, 10)) for p in prompts]


def test_models_and_health(mesh):
    models = mesh.openai_client().models.list()
    assert [m.id for m in models.data] == ["tiny"]
    assert httpx.get(f"{mesh.base_url}/health", timeout=10).status_code == 200
    assert "kvmesh_gateway_requests_total" in httpx.get(f"{mesh.base_url}/metrics", timeout=10).text


def _error(reply: httpx.Response) -> dict:
    error = reply.json()["error"]
    assert set(error) >= {"message", "type", "param", "code"}
    return error


@pytest.mark.parametrize("body, status, param", [
    ({"model": "nope", "prompt": "x"}, 404, "model"),
    ({"model": "tiny", "prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ({"model": "tiny", "prompt": "x", "max_tokens": -3}, 400, "max_tokens"),
    ({"model": "tiny", "prompt": "x", "max_tokens": "many"}, 400, "max_tokens"),
    ({"model": "tiny", "prompt": 17}, 400, "prompt"),
    ({"model": "tiny", "prompt": "x", "temperature": "hot"}, 400, "temperature"),
    ({"model": "tiny", "prompt": "x", "n": 99}, 400, "n"),
])
def test_bad_inputs_get_openai_errors(mesh, body, status, param):
    reply = httpx.post(f"{mesh.base_url}/v1/completions", json=body, timeout=30)
    assert reply.status_code == status, reply.text
    assert _error(reply)["param"] == param


def test_malformed_json_is_a_400(mesh):
    reply = httpx.post(f"{mesh.base_url}/v1/chat/completions", content=b"{not json",
                       headers={"Content-Type": "application/json"}, timeout=30)
    assert reply.status_code == 400
    _error(reply)


def test_prompt_over_the_context_says_so(mesh):
    with pytest.raises(openai.BadRequestError) as info:
        mesh.openai_client().completions.create(model="tiny", prompt=[65] * 5000, max_tokens=4)
    assert "maximum context length is" in str(info.value)


def test_mesh_stop_leaves_no_process(start_mesh):
    # start_mesh's teardown asserts that every process of the mesh is gone.
    handle = start_mesh(prefill=0, decode=1, kvstore=False)
    reply = handle.openai_client().completions.create(model="tiny", prompt="local", max_tokens=3)
    assert reply.usage.completion_tokens >= 1
    assert handle.metric("decode-0", "kvmesh_decode_local_prefill_requests_total") == 1


def test_killing_the_launcher_takes_the_whole_mesh_down(tmp_path):
    """`kvmesh up` killed with SIGKILL (no chance to clean up): every child still goes away."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import psutil

    from kvmesh.runtime.launcher import free_port

    launcher = subprocess.Popen([sys.executable, "-m", "kvmesh", "up", "--port", str(free_port()), "--prefill", "0",
                                 "--no-kvstore", "--run-dir", str(tmp_path)], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
    try:
        for line in launcher.stdout:
            if "ready at" in line:
                break
        children = psutil.Process(launcher.pid).children(recursive=True)
        assert len(children) >= 4  # nats, scheduler, decode, gateway
    finally:
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE
                                              for c in children):
        time.sleep(0.2)
    assert [c.pid for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE] == []


def test_the_decode_workers_step_counters_show_what_a_request_ran(mesh):
    from kvmesh.scheduler.sim.steps import difference, parse_metrics  # noqa: PLC0415 - the sim's reader of them

    from .polling import eventually  # noqa: PLC0415

    workers = [s.name for s in mesh.mesh.specs if s.service == "decode"]
    before = {w: parse_metrics(mesh.metrics_text(w)) for w in workers}
    timed = sum(mesh.metric(w, "kvmesh_decode_engine_prefill_seconds_count") for w in workers)
    mesh.openai_client().completions.create(model="tiny", prompt=PROMPT_IDS, max_tokens=24, temperature=0,
                                            extra_body={"ignore_eos": True})

    def ran():
        return [difference(parse_metrics(mesh.metrics_text(w)), before[w]) for w in workers]

    # 23 tokens after the first, each a decode row whose context is at least the prompt's 108 tokens
    assert eventually(lambda: max(r.decode.rows for r in ran()) >= 23)
    worker = max(ran(), key=lambda r: r.decode.rows)
    assert worker.decode.steps >= 1 and worker.decode.seconds > 0
    assert worker.decode.padded >= 108 * worker.decode.rows
    # and its wait in the engine and its prefill, once, on its first token
    assert sum(mesh.metric(w, "kvmesh_decode_engine_prefill_seconds_count") for w in workers) == timed + 1
    assert sum(mesh.metric(w, "kvmesh_decode_engine_queue_seconds_count") for w in workers) == timed + 1
