"""dualmap: two candidates from two independent hashes of the prompt prefix, the better by state.

Each request's prefix (its first `dualmap_prefix_blocks` block hashes; the session or request id
when the prompt has no full block) is mapped to two workers by rendezvous hashing with two seeds,
so the mapping survives workers coming and going. The candidate with the lower predicted TTFT
wins, the warmest worker (most cached blocks) joining as a third candidate so a conversation can
follow its history. When even the winner's predicted TTFT exceeds the SLO, or it is a hot spot
(utilization above `dualmap_hot_factor` × the mean), the request goes by load instead: the
lowest predicted TTFT (queued prefill included) over all workers that are not hot spots.
"""

from __future__ import annotations

import hashlib

from .policy import Choice, Policy, PolicyConfig, RoutingState, WorkerView


def rendezvous(key: bytes, seed: bytes, workers: tuple[WorkerView, ...]) -> WorkerView:
    """The worker with the highest hash of (seed, key, worker_id)."""
    return max(workers, key=lambda w: hashlib.blake2b(seed + key + w.worker_id.encode(), digest_size=8).digest())


class DualMap(Policy):
    name = "dualmap"
    predicts = True

    def __init__(self, config: PolicyConfig) -> None:
        self.config = config

    def prefix_key(self, state: RoutingState) -> bytes:
        request = state.request
        if request.block_hashes:
            return b"".join(request.block_hashes[: max(1, self.config.dualmap_prefix_blocks)])
        return (request.session_id or request.request_id).encode()

    def candidates(self, state: RoutingState) -> list[WorkerView]:
        key = self.prefix_key(state)
        first = rendezvous(key, b"dualmap/1", state.workers)
        others = tuple(w for w in state.workers if w.worker_id != first.worker_id)
        picked = [first] if not others else [first, rendezvous(key, b"dualmap/2", others)]
        warmest = max(state.workers, key=lambda w: (w.cached_blocks, -w.load))
        if warmest.cached_blocks > 0 and warmest not in picked:
            picked.append(warmest)
        return picked

    def choose(self, state: RoutingState) -> Choice:
        def rank(w: WorkerView) -> tuple[float, int, str]:
            return state.predicted_ttft_s(w), -w.cached_blocks, w.worker_id

        limit = self.config.dualmap_hot_factor * state.mean_utilization()
        cool = [w for w in state.workers if limit <= 0.0 or w.utilization <= limit] or list(state.workers)
        best = min(self.candidates(state), key=rank)
        if best not in cool or state.predicted_ttft_s(best) > self.config.dualmap_ttft_slo_s:
            best = min(cool, key=rank)
        return Choice(best.worker_id, state.predicted_ttft_s(best))
