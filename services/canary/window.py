"""One rollout step's window: what was compared and served since the step's weight took effect.

A window has its own comparison (candidate replays of records taken after it opened) and counts
of the production requests each pool served, with their server errors (the candidate's own 5xx).
"""

from __future__ import annotations

from dataclasses import dataclass

from .compare import Comparison


@dataclass(slots=True)
class ServedCounts:
    """Mirrored production requests by the pool that served them."""

    candidate: int = 0
    candidate_5xx: int = 0
    production: int = 0
    production_5xx: int = 0

    def add(self, on_candidate: bool, server_error: bool) -> None:
        if on_candidate:
            self.candidate += 1
            self.candidate_5xx += server_error
        else:
            self.production += 1
            self.production_5xx += server_error

    @property
    def candidate_5xx_rate(self) -> float:
        return self.candidate_5xx / self.candidate if self.candidate else 0.0

    @property
    def production_5xx_rate(self) -> float:
        return self.production_5xx / self.production if self.production else 0.0


class Window:
    """Window `window_id`: a fresh comparison and served counts."""

    def __init__(self, window_id: int, latency_window: int) -> None:
        self.id = window_id
        self.comparison = Comparison(latency_window)
        self.served = ServedCounts()
