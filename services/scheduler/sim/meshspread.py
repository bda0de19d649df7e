"""How far the calibration's fit can be trusted: a bootstrap over the probes' repeats.

Each draw resamples every probe point's repeats with replacement (a hit with the lone request sent
after it, as one pair), keeping the point's count, and refits; a term's spread over the draws is
how much the repeats the probes happened to get move it. A term whose range is wide (a point's
repeats disagreed) should not be trusted to more than its range, and neither should a capacity
that depends on it.
"""

from __future__ import annotations

import dataclasses
import random

from .meshcal import MeshCalibration, Samples, fit

TERMS = ("prefill_s_per_token", "attention_s_per_pair", "decode_s_per_step", "decode_s_per_seq",
         "decode_s_per_kv_token", "decode_s_per_padded_token", "decode_padded_knee_tokens", "request_overhead_s", "request_busy_s", "hit_s_per_token",
         "attention_s_per_cached_pair", "prefill_share", "prefill_s_per_stream", "prefill_s_beside", "prefill_stall", "host_parallelism",
         "host_cpu_s_per_request", "host_cpu_s_per_step", "host_cpu_s_per_token",
         "pause_rate_hz", "pause_s", "handback_s_per_turn", "handback_s_per_token", "prefill_s_new_shape")

_KEYS = {  # how many leading fields name a sample's probe point
    "ttft": 1, "itl": 1, "itl_long": 2, "burst": 2, "pair": 2, "stall": 2, "handback": 2, "shape": 1, "host": 0,
}


def _resample(points: list, key_fields: int, rng: random.Random) -> list:
    groups: dict[tuple, list] = {}
    for point in points:
        groups.setdefault(tuple(point[:key_fields]), []).append(point)
    return [rng.choice(group) for group in groups.values() for _ in group]


def resample(samples: Samples, rng: random.Random) -> Samples:
    """One bootstrap draw of `samples`: each probe point's repeats drawn with replacement."""
    drawn = {name: _resample(getattr(samples, name), fields, rng) for name, fields in _KEYS.items()}
    pairs = list(zip(samples.hit, samples.hit_lone, strict=True)) if samples.hit_lone else [(h, None) for h in samples.hit]
    hits = _resample([(*h, lone) for h, lone in pairs], 2, rng)
    drawn["hit"] = [h[:3] for h in hits]
    drawn["hit_lone"] = [h[3] for h in hits] if samples.hit_lone else []
    drawn["load"] = []  # NOTE: the path-load term is held at its fit on every sample (bootstrap)
    return dataclasses.replace(samples, **drawn)


def bootstrap(samples: Samples, draws: int = 200, seed: int = 0, engine_decode_s_per_seq: float | None = None,
              fitted: MeshCalibration | None = None) -> list[MeshCalibration]:
    """`draws` fits of resampled probe repeats (see resample). NOTE: the path-load term is held at its
    fit on every sample (`fitted`, the caller's fit of `samples`; None: fitted here): fitting it runs
    the sim on the probe's requests, for every draw."""
    rng = random.Random(seed)
    per_rps = 0.0
    if samples.load:
        per_rps = (fitted if fitted is not None else fit(samples, engine_decode_s_per_seq)).request_s_per_rps
    return [dataclasses.replace(fit(resample(samples, rng), engine_decode_s_per_seq), request_s_per_rps=per_rps)
            for _ in range(draws)]


def term_ranges(fits: list[MeshCalibration], low: float = 0.1, high: float = 0.9) -> dict[str, tuple[float, float]]:
    """Each term's [low, high] quantile over the bootstrap fits (nearest rank)."""
    ranges = {}
    for name in TERMS:
        values = sorted(_value(getattr(f, name)) for f in fits)
        ranges[name] = (values[round(low * (len(values) - 1))], values[round(high * (len(values) - 1))])
    return ranges


def spread_lines(cal: MeshCalibration, ranges: dict[str, tuple[float, float]]) -> list[str]:
    """Each term as fitted, with its bootstrap range."""
    return [f"{name.replace('_', '-')} {_value(getattr(cal, name)):.3g} ({lo:.3g} .. {hi:.3g})"
            for name, (lo, hi) in ranges.items()]


def _value(x: float | None) -> float:
    return 0.0 if x is None else float(x)
