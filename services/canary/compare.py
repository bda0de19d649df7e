"""Comparing a replay with the production outcome, one pair at a time and in aggregate.

Per pair: exact match, index of the first differing token, and token agreement (positions that
hold the same token / the longer length). In aggregate: rates over the compared pairs, TTFT/TPOT
quantiles of both sides, error rates, and the noise floor: the agreement of production replayed
against itself, so nondeterminism is not blamed on the candidate.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one run of a request produced."""

    token_ids: tuple[int, ...]
    ttft_s: float
    tpot_s: float
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error


@dataclass(frozen=True, slots=True)
class TokenMatch:
    exact: bool
    first_divergence: int | None  # None when the sequences are identical
    agreement: float


def match_tokens(reference: Sequence[int], other: Sequence[int]) -> TokenMatch:
    """Compares two token sequences position by position."""
    longest = max(len(reference), len(other))
    if longest == 0:
        return TokenMatch(True, None, 1.0)
    same = [a == b for a, b in zip(reference, other)]
    matching = sum(same)
    if matching == longest:
        return TokenMatch(True, None, 1.0)
    first = same.index(False) if False in same else len(same)
    return TokenMatch(False, first, matching / longest)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between ranks; 0.0 when empty."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True, slots=True)
class Quantiles:
    p50: float
    p99: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Quantiles:
        return cls(percentile(values, 50), percentile(values, 99))


@dataclass(frozen=True, slots=True)
class LatencyDelta:
    production: Quantiles
    candidate: Quantiles

    @property
    def delta_p50(self) -> float:
        return self.candidate.p50 - self.production.p50

    @property
    def delta_p99(self) -> float:
        return self.candidate.p99 - self.production.p99


@dataclass(frozen=True, slots=True)
class Summary:
    samples: int  # candidate replays finished (ok or not)
    compared: int  # pairs where both sides succeeded, the base of the token rates
    exact_match_rate: float
    token_agreement: float
    mean_first_divergence: float  # over pairs that differ; -1.0 when none differ
    noise_samples: int
    noise_floor_agreement: float  # 1.0 until a production replay says otherwise
    ttft: LatencyDelta
    tpot: LatencyDelta
    production_error_rate: float
    candidate_error_rate: float


class _TokenStats:
    def __init__(self) -> None:
        self.pairs = 0
        self.exact = 0
        self.agreement_sum = 0.0
        self.divergent = 0
        self.divergence_sum = 0

    def add(self, match: TokenMatch) -> None:
        self.pairs += 1
        self.exact += match.exact
        self.agreement_sum += match.agreement
        if match.first_divergence is not None:
            self.divergent += 1
            self.divergence_sum += match.first_divergence

    def agreement(self, empty: float) -> float:
        return self.agreement_sum / self.pairs if self.pairs else empty


class Comparison:
    """Accumulates pairs. Latency quantiles cover the last `latency_window` samples of each side."""

    def __init__(self, latency_window: int = 10_000) -> None:
        self._candidate = _TokenStats()
        self._noise = _TokenStats()
        self._samples = 0
        self._production_errors = 0
        self._candidate_errors = 0
        self._latency = {
            name: deque(maxlen=latency_window)
            for name in ("production_ttft", "production_tpot", "candidate_ttft", "candidate_tpot")
        }

    def add_candidate(self, production: Outcome, candidate: Outcome) -> TokenMatch | None:
        """One production outcome and its candidate replay; the token match when both succeeded."""
        self._samples += 1
        self._production_errors += not production.ok
        self._candidate_errors += not candidate.ok
        self._add_latency("production", production)
        self._add_latency("candidate", candidate)
        if not (production.ok and candidate.ok):
            return None
        match = match_tokens(production.token_ids, candidate.token_ids)
        self._candidate.add(match)
        return match

    def add_noise(self, production: Outcome, replay: Outcome) -> TokenMatch | None:
        """One production outcome and its replay on production itself."""
        if not (production.ok and replay.ok):
            return None
        match = match_tokens(production.token_ids, replay.token_ids)
        self._noise.add(match)
        return match

    def _add_latency(self, side: str, outcome: Outcome) -> None:
        if not outcome.ok:
            return
        self._latency[f"{side}_ttft"].append(outcome.ttft_s)
        # NOTE: a one-token output has no time per output token; a 0 would drag the quantiles down.
        if len(outcome.token_ids) > 1:
            self._latency[f"{side}_tpot"].append(outcome.tpot_s)

    def summary(self) -> Summary:
        c, lat = self._candidate, self._latency
        return Summary(
            samples=self._samples,
            compared=c.pairs,
            exact_match_rate=c.exact / c.pairs if c.pairs else 0.0,
            token_agreement=c.agreement(0.0),
            mean_first_divergence=c.divergence_sum / c.divergent if c.divergent else -1.0,
            noise_samples=self._noise.pairs,
            noise_floor_agreement=self._noise.agreement(1.0),
            ttft=LatencyDelta(Quantiles.of(lat["production_ttft"]), Quantiles.of(lat["candidate_ttft"])),
            tpot=LatencyDelta(Quantiles.of(lat["production_tpot"]), Quantiles.of(lat["candidate_tpot"])),
            production_error_rate=self._production_errors / self._samples if self._samples else 0.0,
            candidate_error_rate=self._candidate_errors / self._samples if self._samples else 0.0,
        )
