"""A fake engine for the step loops' tests: `requests` requests, each makes one token a step until
it has `tokens`; step `fail_at` raises. It holds as `LLMEngine.step(hold=True)` does: a request
that has sent output keeps its tokens until `take_held` (its first output and its end at once)."""

from __future__ import annotations

from kvmesh.engine.outputs import EngineStats, RequestOutput


class CountingEngine:
    def __init__(self, requests: int, tokens: int, fail_at: int = 0) -> None:
        self.made = {f"r{i}": 0 for i in range(requests)}
        self.unsent: dict[str, list[int]] = {rid: [] for rid in self.made}
        self.tokens = tokens
        self.fail_at = fail_at
        self.steps = 0
        self.last_step_ran = False

    def has_unfinished_requests(self) -> bool:
        return bool(self.made)

    def num_unfinished_requests(self) -> int:
        return len(self.made)

    @property
    def num_held(self) -> int:
        return sum(1 for rid, tokens in self.unsent.items() if tokens and rid in self.made)

    def step(self, hold: bool = False) -> list[RequestOutput]:
        self.steps += 1
        if self.steps == self.fail_at:
            raise RuntimeError("kernel failed")
        self.last_step_ran = bool(self.made)
        outs = []
        for rid in list(self.made):
            n = self.made[rid] = self.made[rid] + 1
            self.unsent[rid].append(n)
            done = n == self.tokens
            if hold and not done and n > len(self.unsent[rid]):
                continue
            outs.append(self._take(rid, done))
            if done:
                del self.made[rid]
        return outs

    def take_held(self) -> list[RequestOutput]:
        return [self._take(rid, False) for rid in self.made if self.unsent[rid]]

    def _take(self, rid: str, done: bool) -> RequestOutput:
        tokens, self.unsent[rid] = self.unsent[rid], []
        n = self.made[rid]
        return RequestOutput(rid, tokens, "", done, "length" if done else None, None, 3, n, 0, 3 + n)

    def stats(self) -> EngineStats:
        return EngineStats(len(self.made), 0, 10, 10, 0, 0, 0, 0, 0)
