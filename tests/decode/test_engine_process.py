"""The decode engine in its own process (setting `engine_process`): requests, one step frame per
step, aborts and KV both ways across the process boundary; a killed engine fails its requests
and takes the worker out of service."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import grpc
import pytest
import pytest_asyncio
import torch

from kvmesh.decode.main import start
from kvmesh.engine.sampling import SamplingParams
from kvmesh.runtime.errors import Unavailable
from kvmesh.runtime.pb import decode_pb2_grpc
from kvmesh.worker.engineproc import EngineProcess
from kvmesh.worker.watchdog import stalled, watch_engine

from .helpers import PROMPT, decode_settings, generate_request, greedy

pytestmark = pytest.mark.asyncio(loop_scope="module")
GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def engine():
    # NOTE: a step budget for all eight prompts at once: they decode together however the adds straddle steps
    proc = await EngineProcess.spawn("kvmesh.decode.enginehost",
                                     decode_settings(engine_process=True, max_num_batched_tokens=128))
    proc.start()
    yield proc
    await proc.stop()


async def run(engine: EngineProcess, request_id: str, prompt: list[int], kv=None, params=GREEDY) -> tuple[list[int], str]:
    """One request through `add_prefilled`; its tokens and how its KV came."""
    done = asyncio.get_running_loop().create_future()
    tokens: list[int] = []

    def deliver(item) -> None:
        if isinstance(item, BaseException):
            done.set_exception(item)
            return
        tokens.extend(item.new_token_ids)
        if item.finished:
            done.set_result(item.finish_reason)

    how = await engine.start_request(request_id, deliver, "add_prefilled", request_id, prompt, params, False, kv, 0)
    assert await asyncio.wait_for(done, 30) == "length"
    return tokens, how


def reference_kv(reference, prompt: list[int]) -> list[torch.Tensor]:
    """The reference engine's KV of the prompt's full blocks, each [2, L, block_size, H, D]."""
    reference.generate([prompt], SamplingParams(temperature=0.0, max_tokens=1))
    return reference.export_cached_blocks(prompt)


async def test_a_request_runs_end_to_end_in_the_engine_process(engine, reference) -> None:
    tokens, how = await run(engine, "one", PROMPT)
    assert (tokens, how) == (greedy(reference, PROMPT, 6), "local")
    assert engine.stats.num_running == 0 and engine.stats.num_generated_tokens >= 6


async def test_one_step_frame_carries_every_requests_output(engine, reference) -> None:
    prompts = [PROMPT[:-1] + [40 + i] for i in range(8)]
    frames: list[int] = []
    engine.step_hooks.append(lambda _engine, outputs: frames.append(len(outputs)))
    # NOTE: 24 tokens each, not 6: the eight adds cross the pipe one by one, and on a loaded host the first
    # requests had finished their 6 before the last joined (max frame 7, in 4-5 of 8 runs of this file here)
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    try:
        results = await asyncio.gather(*(run(engine, f"many-{i}", p, params=params) for i, p in enumerate(prompts)))
    finally:
        engine.step_hooks.clear()
    assert [tokens for tokens, _ in results] == [greedy(reference, p, 24) for p in prompts]
    assert max(frames) == 8  # NOTE: 8 decoding requests, one frame a step, not a message per request
    assert sum(frames) >= 8 * 24


async def test_a_cancelled_request_stops_delivering_and_leaves_the_engine(engine) -> None:
    seen: list = []
    first = asyncio.Event()

    def deliver(item) -> None:
        seen.append(item)
        first.set()

    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    await engine.start_request("long", deliver, "add_prefilled", "long", PROMPT[:-2] + [7, 7], params, False, None, 0)
    await asyncio.wait_for(first.wait(), 30)
    engine.cancel("long")
    count = len(seen)
    for _ in range(100):
        if not await engine.call("has_unfinished_requests"):
            break
        await asyncio.sleep(0.02)
    assert not await engine.call("has_unfinished_requests")
    assert len(seen) == count and not seen[-1].finished


async def test_pushed_kv_goes_in_and_pinned_blocks_come_back_byte_for_byte(engine, reference) -> None:
    prompt = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23]
    blocks = reference_kv(reference, prompt)  # 3 full blocks: all the 12 tokens before the last
    tokens, how = await run(engine, "pushed", prompt, kv=torch.cat(blocks, dim=2))
    assert (tokens, how) == (greedy(reference, prompt, 6), "remote")
    pinned = await engine.call("pin_turns", [[prompt, 0]])
    kv, counts = await engine.offload("read_turns", pinned)
    engine.call_nowait("unpin_turns", pinned)
    assert counts == [3] and all(torch.equal(a, b) for a, b in zip(kv, blocks))


async def test_a_reply_larger_than_the_receive_buffer_comes_back_byte_for_byte(reference, monkeypatch) -> None:
    """read_turns' blocks leave the engine process from the tensors' memory (a gathered send) and a
    frame past the worker's scratch buffer is received into a buffer of its own (framereceiver.py)."""
    monkeypatch.setattr("kvmesh.worker.framereceiver.SCRATCH_BYTES", 4096)  # 3 blocks of tiny: ~6 KiB
    proc = await EngineProcess.spawn("kvmesh.decode.enginehost", decode_settings(engine_process=True))
    proc.start()
    try:
        prompt = [41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53]
        blocks = reference_kv(reference, prompt)
        assert (await run(proc, "large", prompt))[0] == greedy(reference, prompt, 6)  # small frames: the scratch
        pinned = await proc.call("pin_turns", [[prompt, 0], [prompt, 1]])
        before = proc._reader.large_frames
        kv, counts = await proc.offload("read_turns", pinned)
        proc.call_nowait("unpin_turns", pinned)
        assert proc._reader.large_frames == before + 1
        assert counts == [3, 2]
        first, second = kv.split(counts)  # the turns' blocks, in order, in one tensor
        assert all(torch.equal(a, b) for a, b in zip(first, blocks))
        assert all(torch.equal(a, b) for a, b in zip(second, blocks[1:]))
    finally:
        await proc.stop()


async def test_prewarmed_blocks_cross_by_hash(engine, reference) -> None:
    prompt = [31, 32, 33, 34, 35, 36, 37, 38, 39]
    blocks = reference_kv(reference, prompt)[:2]
    hashes = reference.hasher.hashes(prompt)
    assert await engine.call("import_by_hash", hashes, blocks, 0) == 2
    assert await engine.call("cached_prefix_blocks", prompt) == 2


async def test_a_closure_is_refused_by_name(engine) -> None:
    with pytest.raises(TypeError, match="named command"):
        await engine.call(lambda e: e.stats())


async def test_a_killed_engine_fails_its_requests_and_takes_the_worker_out_of_service() -> None:
    app = await start(decode_settings(engine_process=True))
    try:
        async with grpc.aio.insecure_channel(app.endpoint) as channel:
            stub = decode_pb2_grpc.DecodeWorkerStub(channel)
            call = stub.Generate(generate_request(max_tokens=30), timeout=30)
            await call.read()
            os.kill(app.loop.pid, signal.SIGKILL)
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                while await call.read() is not grpc.aio.EOF:
                    pass
            assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "engine process" in failed.value.details()
            assert stalled(app.loop, 30.0, 0.0)
            await asyncio.wait_for(watch_engine(app.loop, 30.0, app.deregister, interval_s=0.05), 5)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.Generate(generate_request(), timeout=10).read()
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            with pytest.raises(Unavailable):
                await app.loop.call("has_unfinished_requests")
    finally:
        await asyncio.wait_for(app.stop(), 15)


async def test_a_request_after_a_long_idle_is_not_a_stall(engine) -> None:
    # NOTE: an idle child sends no step frames, so progress_at stays at the last one's. A request
    # arriving after more than the stall budget of idleness had work pending and "no progress" until
    # its first step frame: a watchdog look in that gap deregistered a healthy worker (a fresh-clone
    # e2e run: "engine made no progress for 71.1 s with work pending").
    await run(engine, "before-idle", PROMPT)
    engine.progress_at -= 100.0  # what 100 s of idleness leaves
    started = asyncio.create_task(run(engine, "after-idle", PROMPT))
    await asyncio.sleep(0)  # the request's add is sent; its reply and first step frame are not in yet
    assert engine.has_work
    assert not stalled(engine, 30.0, time.monotonic())
    await started
