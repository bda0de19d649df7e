"""The calibration's probe loop (meshprobe.py) against a fake mesh: points take turns, a point
whose repeats a burst of noise made disagree is probed again until its median is right, and every
run waits for the mesh to settle first."""

import asyncio
import dataclasses

import pytest

from kvmesh.scheduler.sim.meshcal import fit_prefill
from kvmesh.scheduler.sim.meshprobe import ProbeConfig, _Prober
from kvmesh.scheduler.sim.meshstats import medians
from kvmesh.scheduler.sim.report import Outcome


class FakeMesh(_Prober):
    """TTFT = 10 ms + 20 µs per prompt token; the `slow` requests (by arrival order) take 30 ms more.
    Its sleeps take no time: they are recorded in `sent` as ("sleep", seconds)."""

    def __init__(self, config: ProbeConfig, slow: set[int]) -> None:
        super().__init__(None, None, "fake", config, sleep=self.record_sleep)
        self.slow, self.sent = slow, []
        self.timed_first: list[bool] = []  # per request but the wakers: asked to be timed to its first token, visible or not

    async def record_sleep(self, seconds: float) -> None:
        self.sent.append(("sleep", seconds))

    async def one(self, tokens, max_tokens, times=None, hidden=None):  # noqa: ANN001, ARG002
        waker = max_tokens == 1 and len(tokens) == self.config.wake_tokens and hidden is None
        self.sent.append(("wake", len(tokens)) if waker else len(tokens))
        if not waker:
            self.timed_first.append(hidden is not None)
        if hidden is not None:
            hidden.append(len(tokens) % 3)  # the fake's tokens before its first visible text
        ttft = 0.010 + 2e-5 * len(tokens) + (0.030 if len(requests(self)) in self.slow else 0.0)
        return Outcome(0.0, len(tokens), max_tokens, ttft, ttft + 0.001)

    async def steady(self, k, prompt_tokens):  # noqa: ANN001
        self.sent.append((k, prompt_tokens))
        return 1e-3 * k


def requests(mesh: FakeMesh) -> list:
    """What the mesh was sent, without the probe's sleeps and wakers."""
    return [x for x in mesh.sent if not (isinstance(x, tuple) and x[0] in ("sleep", "wake"))]


def lone_ttft_fit(config: ProbeConfig, slow: set[int]) -> tuple[list[int], tuple[float, float, float]]:
    mesh = FakeMesh(config, slow)
    asyncio.run(mesh.ttft())
    return requests(mesh), fit_prefill(medians(mesh.samples.ttft))


def test_the_lengths_take_turns_and_a_noiseless_mesh_is_probed_repeats_times():
    sent, fitted = lone_ttft_fit(ProbeConfig(lengths=(64, 512, 1536), repeats=3), set())
    # NOTE: each repeat a length not sent before (the engine caches its kernels per token count), recorded as its point's
    assert sent == [64, 512, 1536, 65, 513, 1537, 66, 514, 1538]
    assert fitted == pytest.approx((0.010 + 2e-5, 2e-5, 0.0), abs=1e-12)  # each median's request was one token longer


def test_a_point_whose_repeats_a_burst_bent_is_probed_again_until_its_median_is_right():
    # the burst slows three of the 64-token point's five repeats (requests 7, 10, 13)
    config = ProbeConfig(lengths=(64, 512, 1536), repeats=5)
    sent, fitted = lone_ttft_fit(config, {7, 10, 13})
    assert sent[15:] == [69, 70, 71, 72]  # the 64-token point (only) got the extra repeats, each a new length
    assert fitted == pytest.approx((0.010, 2e-5, 0.0), abs=2e-4)  # within the few tokens the lengths moved
    _, without = lone_ttft_fit(ProbeConfig(lengths=(64, 512, 1536), repeats=5, extra_repeats=0), {7, 10, 13})
    assert without[0] > 0.02  # five repeats and their median alone: the burst moves the intercept 3x


def test_the_long_context_streams_take_turns_with_the_short_ones():
    config = ProbeConfig(lengths=(64, 1536), streams=(1, 4), repeats=2, context_points=((8, 512), (8, 1536), (16, 1024)))
    mesh = FakeMesh(config, set())
    asyncio.run(mesh.itl())
    assert requests(mesh) == [(1, 32), (4, 32), (8, 512), (8, 1536), (16, 1024)] * 2
    assert mesh.samples.itl == [(1, 1e-3), (1, 1e-3), (4, 4e-3), (4, 4e-3)]
    assert mesh.samples.itl_long == [(8, 512 + 32, 8e-3)] * 2 + [(8, 1536 + 32, 8e-3)] * 2 + [(16, 1024 + 32, 16e-3)] * 2


def test_with_two_workers_the_itl_stream_counts_are_per_worker_and_a_lone_stream_stays_one():
    mesh = FakeMesh(ProbeConfig(lengths=(64, 1536), streams=(1, 4), repeats=1, context_points=((8, 1536),), workers=2), set())
    asyncio.run(mesh.itl())
    assert requests(mesh) == [(1, 32), (8, 32), (16, 1536)]
    assert [k for k, _ in mesh.samples.itl] == [1, 8] and mesh.samples.itl_long[0][0] == 16


def test_the_streams_beside_a_prefill_are_counted_in_all_not_per_worker():
    config = ProbeConfig(stall_streams=(0, 8), stall_lengths=(512,), repeats=1, workers=2, burst=2)
    mesh = FakeMesh(config, set())
    calls = []

    async def stall(streams, tokens):
        calls.append((streams, tokens))
        return float(tokens), float(streams), 0.0, 0.0, 0.02

    async def pair():
        return 2.0, 1536.0, 0.1

    mesh.stall, mesh.pair = stall, pair
    asyncio.run(mesh.sharing())
    assert calls == [(0, 512), (8, 512)]
    assert [(n, k) for n, k, *_ in mesh.samples.stall] == [(512, 0), (512, 8)] and mesh.samples.pair == [(2.0, 1536.0, 0.1)]


def test_every_probe_run_starts_settle_s_after_the_one_before():
    config = ProbeConfig(lengths=(64, 1536), streams=(1, 4), repeats=2, context_points=((8, 1536),), settle_s=0.25)
    mesh = FakeMesh(config, set())
    asyncio.run(mesh.itl())
    # each run after the pause and an untimed 8-token request (the waker: the mesh awake, as under load)
    wake = ("wake", 8)
    assert mesh.sent == [("sleep", 0.25), wake, (1, 32), ("sleep", 0.25), wake, (4, 32), ("sleep", 0.25), wake, (8, 1536)] * 2
    quiet = FakeMesh(dataclasses.replace(config, settle_s=0.0, wake_tokens=0), set())
    asyncio.run(quiet.itl())
    assert quiet.sent == [(1, 32), (4, 32), (8, 1536)] * 2  # 0: no waiting, no waker


def test_the_hand_back_probe_sends_the_turns_then_a_lone_stream_at_once_and_one_after_settling():
    config = ProbeConfig(handback_points=((4, 64), (4, 1024)), repeats=1, stream_tokens=8, handback_lone_tokens=100,
                         settle_s=0.3, workers=2)
    mesh = FakeMesh(config, set())
    asyncio.run(mesh.handback())
    wake = ("wake", 8)  # after each pause
    run = [("sleep", 0.3), wake, *[64] * 8, 32, ("sleep", 0.3), wake, 32]  # 4 turns per worker on 2 workers
    assert mesh.sent == run + [("sleep", 0.3), wake, *[1024] * 8, 32, ("sleep", 0.3), wake, 32]
    # the fake mesh is as fast after the turns as after settling: no extra latency
    assert mesh.samples.handback == [(4.0, 64.0 + 8, 0.0), (4.0, 1024.0 + 8, 0.0)]


def test_every_timed_prefill_of_the_hit_probe_has_a_length_not_sent_before():
    mesh = FakeMesh(ProbeConfig(lengths=(64, 1536), repeats=3), set())
    asyncio.run(mesh.ttft())
    asyncio.run(mesh.hits())
    lone, hits = requests(mesh)[:6], requests(mesh)[6:]  # then (the prompt, its repeat, a fresh twin) per hit run
    whole, prefixed = hits[0::6], hits[3::6]  # the shapes take turns: the whole prompt again; 1,024 tokens + new ones
    twins = hits[2::3]
    assert len(set(twins)) == len(twins) and not set(twins) & set(lone)
    assert [again - 1024 for again in hits[4::6]] == [512, 513, 514]  # the new tokens after the prefix: a new count each run
    assert prefixed == [1024] * 3 and [n % 16 for n in whole] == [1, 2, 3]  # a whole prompt again: its last block varies
    assert 8 not in twins + lone  # the wakers' count is never a timed one


def test_a_hits_repeat_is_sent_right_after_an_untimed_waker_and_its_twin_right_after_it():
    config = ProbeConfig(lengths=(64, 1536), repeats=1, extra_repeats=0, hit_new_tokens=(), settle_s=0.3, hit_pause_s=0.2)
    mesh = FakeMesh(config, set())
    asyncio.run(mesh.hits())
    wake = ("wake", 8)
    first, again, twin = requests(mesh)
    assert mesh.sent == [("sleep", 0.3), wake, first, ("sleep", 0.2), wake, again, twin] and again == first != twin
    assert mesh.timed_first == [False, True, True]  # the repeat and its twin only (the fake leaves wakers out)
    assert len(mesh.samples.hit) == 1
    asleep = FakeMesh(dataclasses.replace(config, wake_tokens=0), set())
    asyncio.run(asleep.hits())
    assert asleep.sent == [("sleep", 0.3), first, ("sleep", 0.2), again, twin]  # 0: no wakers


class CachingMesh(FakeMesh):
    """FakeMesh with a prefix cache of whole 16-token blocks (a prompt's last block is always computed);
    `prefilled` gets every request's uncached token count, the engine step's shape."""

    def __init__(self, config: ProbeConfig) -> None:
        super().__init__(config, set())
        self.prompts: list[list[int]] = []
        self.prefilled: list[int] = []

    async def one(self, tokens, max_tokens, times=None, hidden=None):  # noqa: ANN001
        outcome = await super().one(tokens, max_tokens, times, hidden)
        cached = max((len(p) // 16 * 16 for p in self.prompts if tokens[:len(p)] == p), default=0)
        cached = min(cached, (len(tokens) - 1) // 16 * 16)
        self.prompts.append(tokens)
        self.prefilled.append(len(tokens) - cached)
        return dataclasses.replace(outcome, cached_tokens=cached)


def test_a_hits_fresh_twin_never_prefills_the_token_count_its_repeat_just_did():
    mesh = CachingMesh(ProbeConfig(lengths=(64, 1536), repeats=3))
    asyncio.run(mesh.hits())
    timed = mesh.prefilled[3::5] + mesh.prefilled[4::5]  # each run's repeat and its fresh twin (a waker, the prompt, a waker, ...)
    assert len(set(timed)) == len(timed), mesh.prefilled


def test_the_ttft_probes_time_the_first_token_and_the_visibility_probe_counts_hidden_ones():
    mesh = FakeMesh(ProbeConfig(repeats=1, extra_repeats=0, visible_requests=6, visible_prompt_tokens=64), set())
    asyncio.run(mesh.ttft())
    assert mesh.timed_first and all(mesh.timed_first)  # every lone TTFT asks for logprobs (client.stream_one)
    asyncio.run(mesh.visible())
    assert mesh.samples.visible == [64 % 3] * 6
