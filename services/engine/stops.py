"""Stop-string matching over streamed text (pure): cut at the stop, hold back partial matches."""

from __future__ import annotations


class StopStringMatcher:
    """Feed text deltas; get back what is safe to emit and whether a stop string matched.

    NOTE: text that could be the start of a stop string is never emitted, so a match always lies
    in the unemitted text; only that (at most the longest stop string plus one delta) is kept and
    searched, which keeps a long output at O(delta) per call.
    """

    def __init__(self, stop: tuple[str, ...]) -> None:
        self.stop = stop
        self._max_len = max((len(s) for s in stop), default=0)
        self._pending = ""  # text not emitted yet
        self._emitted: list[str] = []

    @property
    def text(self) -> str:
        """Everything emitted so far (stop string cut)."""
        return "".join(self._emitted)

    def add(self, delta: str) -> tuple[str, bool]:
        """Append `delta`; return (text safe to emit now, stopped)."""
        if not self.stop:
            self._emitted.append(delta)
            return delta, False
        text = self._pending + delta
        hits = [i for i in (text.find(s) for s in self.stop) if i >= 0]
        if hits:
            self._pending = ""
            return self._emit(text[: min(hits)]), True
        end = len(text) - self._held_back(text)
        self._pending = text[end:]
        return self._emit(text[:end]), False

    def would_stop(self, delta: str) -> bool:
        """Whether `add(delta)` would match a stop string (nothing changes)."""
        if not self.stop:
            return False
        text = self._pending + delta
        return any(s in text for s in self.stop)

    def flush(self) -> str:
        """Everything not yet emitted (called when the request finishes)."""
        out, self._pending = self._pending, ""
        return self._emit(out)

    def _emit(self, text: str) -> str:
        if text:
            self._emitted.append(text)
        return text

    def _held_back(self, text: str) -> int:
        # NOTE: the longest tail of the text that could still grow into a stop string.
        for k in range(min(self._max_len - 1, len(text)), 0, -1):
            tail = text[-k:]
            if any(s.startswith(tail) for s in self.stop):
                return k
        return 0
