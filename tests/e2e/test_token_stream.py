"""The multiplexed token stream under load, on one real mesh (two decode workers, local prefill):
many streams at once end correctly and never mix, a paused client holds nobody up, and a decode
worker killed mid-step moves every request it had."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import threading
import time

import pytest

from .conftest import _start, _stop_and_check
from .polling import eventually


MAX_TOKENS = 240  # long enough that every request is still running when the worker is killed


@pytest.fixture(scope="module")
def two_decode_mesh(tmp_path_factory):
    handle = _start(tmp_path_factory, prefill=0, decode=2, kvstore=False)
    yield handle
    _stop_and_check(handle)


@pytest.fixture(scope="module")
def engine():
    from kvmesh.engine.llm import EngineConfig, LLMEngine  # noqa: PLC0415

    return LLMEngine(EngineConfig(model="tiny", dtype="float32"))


def expected(engine, prompt: list[int], max_tokens: int, stop: tuple[str, ...] = ()) -> tuple[str, str, int]:
    """(text, finish_reason, completion tokens) of the in-process engine, greedy."""
    from kvmesh.engine.sampling import SamplingParams  # noqa: PLC0415

    [done] = engine.generate([prompt], SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, stop=stop))
    return done.text, done.finish_reason, len(done.token_ids)


def run_stream(client, prompt: list[int], max_tokens: int, stop: list[str] | None, disconnect: bool) -> tuple:
    chunks = client.completions.create(model="tiny", prompt=prompt, max_tokens=max_tokens, temperature=0, stream=True,
                                       stop=stop, stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    text, finish, usage = [], None, None
    for chunk in chunks:
        if disconnect:
            chunks.close()  # the client goes away mid-stream
            return None
        if chunk.choices:
            text.append(chunk.choices[0].text)
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage:
            usage = chunk.usage.completion_tokens
    return "".join(text), finish, usage


def test_64_concurrent_streams_with_mixed_limits_stops_and_disconnects_end_correctly(two_decode_mesh, engine):
    client = two_decode_mesh.openai_client(timeout=120)
    jobs = []
    for i in range(64):
        prompt = [40 + (i * 7 + j * 3) % 80 for j in range(6 + i % 11)]  # distinct prompts: a leak shows
        max_tokens = 1 + (i * 13) % 48
        stop = None
        if i % 4 == 1:  # a stop string that does occur: two characters from the middle of the output
            full = expected(engine, prompt, max_tokens + 8)[0]
            stop = [full[len(full) // 2 : len(full) // 2 + 2]] if len(full) > 4 else None
        jobs.append((prompt, max_tokens, stop, i % 8 == 3))
    with concurrent.futures.ThreadPoolExecutor(64) as pool:
        results = list(pool.map(lambda job: run_stream(client, *job), jobs))
    stopped = 0
    for (prompt, max_tokens, stop, disconnect), got in zip(jobs, results):
        if disconnect:
            assert got is None
            continue
        want = expected(engine, prompt, max_tokens, tuple(stop or ()))
        assert got == want, (prompt, max_tokens, stop)
        stopped += want[1] == "stop"
    assert stopped >= 4  # stop strings really ended requests early
    # disconnected requests were aborted: nothing is left running anywhere
    assert eventually(lambda: two_decode_mesh.metric("gateway", "kvmesh_gateway_inflight_requests") == 0)
    assert eventually(lambda: sum(two_decode_mesh.metric(f"decode-{i}", "kvmesh_decode_running_requests") for i in (0, 1)) == 0)


def test_a_paused_client_does_not_hold_up_the_others(two_decode_mesh, engine):
    client = two_decode_mesh.openai_client(timeout=120)
    prompt = [50 + j % 30 for j in range(20)]
    release = threading.Event()
    others_done_while_paused = []

    def paused() -> str:
        chunks = client.completions.create(model="tiny", prompt=prompt, max_tokens=64, temperature=0, stream=True,
                                           extra_body={"ignore_eos": True})
        text = []
        for n, chunk in enumerate(chunks):
            if n == 1:
                release.wait(60)  # stops reading while the others run
            text.append(chunk.choices[0].text if chunk.choices else "")
        return "".join(text)

    def normal(i: int) -> str:
        p = prompt[:10] + [60 + i]
        reply = client.completions.create(model="tiny", prompt=p, max_tokens=32, temperature=0, stream=True,
                                          extra_body={"ignore_eos": True})
        text = "".join(c.choices[0].text for c in reply if c.choices)
        others_done_while_paused.append(not release.is_set())
        return text

    with concurrent.futures.ThreadPoolExecutor(9) as pool:
        slow = pool.submit(paused)
        time.sleep(0.5)
        texts = list(pool.map(normal, range(8)))
        release.set()
        assert slow.result(timeout=60) == expected(engine, prompt, 64)[0]
    assert all(others_done_while_paused) and len(others_done_while_paused) == 8
    assert texts == [expected(engine, prompt[:10] + [60 + i], 32)[0] for i in range(8)]


def test_a_decode_worker_killed_mid_step_migrates_every_request_of_its_stream(two_decode_mesh, engine):
    client = two_decode_mesh.openai_client(timeout=120)
    prompts = [[33 + (i * 5 + j) % 90 for j in range(12)] for i in range(12)]
    started = threading.Barrier(13)

    def one(prompt: list[int]) -> tuple:
        chunks = client.completions.create(model="tiny", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, stream=True,
                                           stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        text, usage, waited = [], None, False
        for chunk in chunks:
            if chunk.choices:
                text.append(chunk.choices[0].text)
                if not waited:
                    waited = True
                    started.wait(60)
            if chunk.usage:
                usage = chunk.usage.completion_tokens
        return "".join(text), usage

    victim = two_decode_mesh.pid("decode-0")
    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        futures = [pool.submit(one, p) for p in prompts]
        started.wait(60)  # every request is streaming
        # more than one request runs on the victim's stream when it dies (gauges refresh each 0.5 s)
        assert eventually(lambda: two_decode_mesh.metric("decode-0", "kvmesh_decode_running_requests") >= 2, 5)
        os.kill(victim, signal.SIGKILL)
        results = [f.result(timeout=120) for f in futures]
    for prompt, (text, usage) in zip(prompts, results):
        want_text, _, want_tokens = expected(engine, prompt, MAX_TOKENS)
        assert (text, usage) == (want_text, want_tokens)  # nothing lost, nothing twice
