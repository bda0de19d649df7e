"""How fast the mesh's host runs right now, and the sim's costs scaled to it.

A calibration describes the host as it ran during its probes. On a shared machine (a cloud VM, a
laptop with other work) the same mesh runs 20-40% faster or slower minutes later: on the 2-core
development VM a 1-worker mesh served 17.4 req/s in one fidelity run and 21.9 in the next, 33
minutes apart, while the in-process engine's own speed moved 84 → 112 req/s of sim capacity. A sim
compared with a replay then measures the host's drift as much as the model.

The reference probe (`measure`) is short (~3 s): a lone uncached prompt of `prompt_tokens` (its
TTFT: prefill) and a lone stream of `stream_tokens` (its ITL: decode), taking turns `repeats`
times, medians. Taken during a calibration and again before a replay, the ratio of the two
(`speed_ratio`, the geometric mean of the TTFT and ITL ratios) is how much slower (> 1) the host
runs now, and `scaled` multiplies every time the sim charges by it: the engine's costs and the
mesh's time terms, not the dimensionless ones (shares, stall fraction, the host's parallelism,
the noise's factors, the knee, rates) nor the admission deadline.
"""

from __future__ import annotations

import asyncio
import math
import statistics
from dataclasses import dataclass, replace

from ..policy import CostModel
from .client import Target, new_client, served_model, stream_one
from .meshcost import MeshCost
from .meshcal import Samples
from .meshprobe import FreshPrompts, ProbeConfig, probe

MESH_TIME_TERMS = (
    "attention_s_per_pair", "attention_s_per_cached_pair", "request_overhead_s", "request_s_per_rps", "request_busy_s", "token_overhead_s",
    "decode_s_per_context_token", "decode_s_per_kv_token", "decode_s_per_padded_token", "hit_s_per_token", "handback_s_per_turn",
    "handback_s_per_token", "prefill_s_per_stream", "prefill_s_beside", "prefill_s_new_shape", "pause_s",
    "host_cpu_s_per_request", "host_cpu_s_per_step", "host_cpu_s_per_token",
)
ENGINE_TIME_TERMS = ("prefill_s_per_token", "decode_s_per_step", "decode_s_per_seq")


@dataclass(frozen=True, slots=True)
class Speed:
    """The reference probe's medians: a lone prefill's TTFT and a lone stream's ITL."""

    ttft_s: float
    itl_s: float

    def describe(self) -> str:
        return f"lone prefill TTFT {self.ttft_s * 1e3:.1f} ms, lone stream ITL {self.itl_s * 1e3:.2f} ms"


@dataclass(frozen=True, slots=True)
class SpeedConfig:
    prompt_tokens: int = 1024
    stream_tokens: int = 64
    repeats: int = 5
    settle_s: float = 0.3


def pooled(speeds: list[Speed]) -> Speed:
    """One reference from several probes (say, at a calibration's start and end): the medians of each."""
    return Speed(statistics.median(s.ttft_s for s in speeds), statistics.median(s.itl_s for s in speeds))


def speed_ratio(now: Speed, reference: Speed) -> float:
    """How much slower the host runs now than at `reference` (> 1: slower): the geometric mean of the
    TTFT and ITL ratios, so prefill and decode weigh alike."""
    if min(now.ttft_s, now.itl_s, reference.ttft_s, reference.itl_s) <= 0:
        raise ValueError("speed probes must have positive timings")
    return math.sqrt(now.ttft_s / reference.ttft_s * now.itl_s / reference.itl_s)


DRIFT_TOLERANCE = 0.15  # a calibration whose host drifted more than this (15%) is calibrated again


def drift(start: Speed, end: Speed) -> float:
    """How far the host's speed moved between a calibration's start and end, either way (>= 1):
    its probes then measured a host that changed under them (run AU: 0.68x, a 1-stream ITL of
    6.1 ms beside 3.3 at 4 streams), and its fit mixes the two speeds."""
    ratio = speed_ratio(end, start)
    return max(ratio, 1.0 / ratio)


def steadiest(drifts: list[float], tolerance: float) -> int:
    """Which of several calibrations to keep: the first whose host drifted at most `tolerance`
    (0.15: 15%), else the one that drifted least."""
    for i, d in enumerate(drifts):
        if d <= 1.0 + tolerance:
            return i
    return min(range(len(drifts)), key=drifts.__getitem__)


def scaled(cost: CostModel, mesh: MeshCost, factor: float) -> tuple[CostModel, MeshCost]:
    """The sim's costs on a host `factor` times slower (every time term × factor)."""
    if factor <= 0:
        raise ValueError("the time scale must be > 0")
    engine = {name: getattr(cost, name) * factor for name in ENGINE_TIME_TERMS}
    terms = {name: getattr(mesh, name) * factor for name in MESH_TIME_TERMS if getattr(mesh, name) is not None}
    return replace(cost, **engine), replace(mesh, **terms)


async def measure(target: Target, config: SpeedConfig = SpeedConfig()) -> Speed:
    """The reference probe against the mesh behind `target` (see the module docstring)."""
    prompt = FreshPrompts()
    ttfts: list[float] = []
    itls: list[float] = []
    async with new_client(target) as client:
        model = await served_model(client, target)
        for _ in range(config.repeats):
            for tokens, max_tokens, into, timing in ((config.prompt_tokens, 2, ttfts, "ttft_s"),
                                                     (32, config.stream_tokens, itls, "itl_s")):
                await asyncio.sleep(config.settle_s)
                # NOTE: timed to the first token, visible or not, as the calibration's TTFT probes are
                outcome = await stream_one(client, target, model, prompt(tokens), max_tokens,
                                           hidden=[] if timing == "ttft_s" else None)
                if not outcome.ok:
                    raise RuntimeError(f"speed probe request failed with status {outcome.status}")
                into.append(getattr(outcome, timing))
    return Speed(statistics.median(ttfts), statistics.median(itls))


def timed_probe(target: Target, config: ProbeConfig) -> tuple[list[Speed], Samples]:
    """A calibration's probes with the reference probe before and after them: ([start, end], the
    probe timings). `kvmesh sim calibrate` and bench/simfidelity.py both calibrate this way."""
    speeds = [asyncio.run(measure(target))]
    samples = asyncio.run(probe(target, config))
    speeds.append(asyncio.run(measure(target)))
    return speeds, samples
