"""An injected clock for pure cores: `clock()` reads it, `clock.advance(s)` moves it."""


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
