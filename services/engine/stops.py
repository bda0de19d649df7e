"""Stop-string matching over streamed text (pure): cut at the stop, hold back partial matches."""

from __future__ import annotations


class StopStringMatcher:
    """Feed text deltas; get back what is safe to emit and whether a stop string matched."""

    def __init__(self, stop: tuple[str, ...]) -> None:
        self.stop = stop
        self._max_len = max((len(s) for s in stop), default=0)
        self.text = ""
        self._emitted = 0

    def add(self, delta: str) -> tuple[str, bool]:
        """Append `delta`; return (text safe to emit now, stopped)."""
        before = len(self.text)
        self.text += delta
        if self.stop:
            cut = self._find_stop(max(0, before - self._max_len + 1))
            if cut is not None:
                self.text = self.text[:cut]
                return self.flush(), True
        end = len(self.text) - self._held_back()
        if end <= self._emitted:
            return "", False
        out = self.text[self._emitted : end]
        self._emitted = end
        return out, False

    def flush(self) -> str:
        """Everything not yet emitted (called when the request finishes)."""
        out = self.text[self._emitted :]
        self._emitted = len(self.text)
        return out

    def _find_stop(self, start: int) -> int | None:
        hits = [i for i in (self.text.find(s, start) for s in self.stop) if i >= 0]
        return min(hits) if hits else None

    def _held_back(self) -> int:
        # NOTE: the longest tail of the text that could still grow into a stop string.
        for k in range(min(self._max_len - 1, len(self.text)), 0, -1):
            tail = self.text[-k:]
            if any(s.startswith(tail) for s in self.stop):
                return k
        return 0
