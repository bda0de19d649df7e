"""Sticky sessions: a session keeps its decode worker while it is used within `ttl_s`, unless
that worker is overloaded (`overloaded`): stickiness is a cache-locality hint and always yields to load."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class StickySessions:
    ttl_s: float = 300.0
    max_sessions: int = 100_000
    _sessions: dict[str, tuple[str, float]] = field(default_factory=dict)

    @property
    def enabled(self) -> bool:
        return self.ttl_s > 0

    def get(self, session_id: str, now: float) -> str | None:
        """The session's worker, or None when unknown or idle longer than the TTL."""
        if not session_id or not self.enabled:
            return None
        entry = self._sessions.get(session_id)
        if entry is None:
            return None
        if now - entry[1] > self.ttl_s:
            del self._sessions[session_id]
            return None
        return entry[0]

    def put(self, session_id: str, worker_id: str, now: float) -> None:
        if not session_id or not self.enabled:
            return
        self._sessions.pop(session_id, None)
        self._sessions[session_id] = (worker_id, now)
        if len(self._sessions) > self.max_sessions:
            del self._sessions[next(iter(self._sessions))]  # the least recently used

    def forget_worker(self, worker_id: str) -> None:
        for session_id in [s for s, (w, _) in self._sessions.items() if w == worker_id]:
            del self._sessions[session_id]

    def prune(self, now: float) -> None:
        for session_id in [s for s, (_, t) in self._sessions.items() if now - t > self.ttl_s]:
            del self._sessions[session_id]

    def __len__(self) -> int:
        return len(self._sessions)


def overloaded(load: int, capacity: int, loads: list[int], factor: float) -> bool:
    """True when a sticky worker must yield: it is full (`load >= capacity`, its max_num_seqs), or
    it carries at least `factor` times its fair share of the pool's load (the mean, at least 1).

    NOTE: without this, one app sending a constant session (or OpenAI `user`) pinned all of its
    traffic to one decode worker while the others idled.
    """
    if load >= capacity:
        return True
    if factor <= 0 or len(loads) < 2:
        return False
    fair_share = max(1.0, sum(loads) / len(loads))
    return load >= factor * fair_share
