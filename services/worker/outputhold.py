"""Holds requests' new tokens where the engine steps, so that under load they leave together.

Under load (at least `hold_from` requests in the engine) a decode worker sends its requests'
tokens every `interval` engine steps, all of them on the same step (`stream_interval`,
docs/token-stream.md), and sooner when the oldest of them has waited `max_hold_s`
(`stream_interval_ms`): what a client waits for a token is bounded in time too, however long an
engine step takes (a large model's 30 ms steps would otherwise hold a token 8 x 30 ms). Both
count from the step the hold began (its first held token), not from step numbers that are
multiples of `interval`: with those, a hold that the time bound let go a step or two before such a
step was followed by one of a step or two on it. Steps of 20/6-20/4 ms (`tiny` at 64 requests on
two CPUs) then sent 32-33 frames and SSE chunks a request per 128 tokens instead of 20-25. A
request's first output (it may carry prompt logprobs and the time to its first token) and its end
go at once, the step they are made. Below that load every output goes the step it is made.

Why here and not in the worker's stream (where it was): there, every engine step still carried
every running request's token to the worker's event loop, which woke, decoded and filed each one
to hold it. Held where they are made, an engine process sends no step frame at all on the steps
that have nothing due (`EngineHost`), so its worker's RPC process wakes once per `interval` steps
(plus the steps with a first token or an end), and one `StepOutput` to the gateway carries every
request's tokens. Both engine loops (`EngineHost`, `EngineLoop`) hold the same way.

Held outputs of one request merge into one (token ids, text and logprobs appended, the counts the
latest). Pure: no I/O; the caller passes the clock.
"""

from __future__ import annotations

from kvmesh.engine.outputs import RequestOutput


class OutputHold:
    """Per-request held output between engine steps; see the module docstring."""

    __slots__ = ("interval", "hold_from", "max_hold_s", "_held", "_held_since", "_held_from")

    def __init__(self, interval: int = 1, hold_from: int = 1, max_hold_s: float = 0.0) -> None:
        self.interval = max(1, interval)
        self.hold_from = max(1, hold_from)
        self.max_hold_s = max_hold_s  # 0: no time bound
        self._held: dict[str, RequestOutput] = {}
        self._held_since = 0.0  # when the oldest held output was made (the clock `take` is given)
        self._held_from = 0  # the step it was made

    @classmethod
    def from_settings(cls, settings: object) -> OutputHold:
        """A role's hold: its `stream_interval`, `stream_interval_from` and `stream_interval_ms` (a
        decode worker's), else none."""
        return cls(getattr(settings, "stream_interval", 1), getattr(settings, "stream_interval_from", 1),
                   getattr(settings, "stream_interval_ms", 0.0) / 1000)

    def __len__(self) -> int:
        return len(self._held)

    def take(self, outputs: list[RequestOutput], in_engine: int, step: int, now: float = 0.0) -> list[RequestOutput]:
        """What of this step's `outputs` (and what was held) goes out now; `in_engine`: the
        requests the engine has (running and waiting); `step`: the step's number; `now`: a
        monotonic clock in seconds (for `max_hold_s`)."""
        if self.interval == 1 or in_engine < self.hold_from:
            if not self._held:
                return outputs
            return self._merged_all(outputs)
        held, due = self._held, []
        if not held:
            self._held_since, self._held_from = now, step
        for out in outputs:
            prev = held.pop(out.request_id, None)
            if prev is not None:
                out = _merge(prev, out)
            if out.finished or out.num_output_tokens <= len(out.new_token_ids):  # its end, or its first token(s)
                due.append(out)
            else:
                held[out.request_id] = out
        if held and (step - self._held_from + 1 >= self.interval or 0 < self.max_hold_s <= now - self._held_since):
            due.extend(held.values())
            held.clear()
        return due

    def drop_all(self) -> None:
        """Forget every held output (the engine failed a step: the worker fails its requests)."""
        self._held.clear()

    def _merged_all(self, outputs: list[RequestOutput]) -> list[RequestOutput]:
        """Below the load that holds: this step's outputs merged with the held ones, and the held
        ones whose request made nothing this step (a preempted one), all due now."""
        held, self._held = self._held, {}
        due = [_merge(held.pop(out.request_id), out) if out.request_id in held else out for out in outputs]
        due.extend(held.values())
        return due


def _merge(prev: RequestOutput, out: RequestOutput) -> RequestOutput:
    """`prev` (held) followed by `out` (this step's), as one output; reuses `prev`."""
    prev.new_token_ids += out.new_token_ids
    prev.new_text += out.new_text
    if out.logprobs is not None:
        prev.logprobs = (prev.logprobs or []) + out.logprobs
    prev.finished, prev.finish_reason = out.finished, out.finish_reason
    prev.num_prompt_tokens, prev.num_output_tokens = out.num_prompt_tokens, out.num_output_tokens
    prev.num_cached_tokens, prev.num_computed_tokens = out.num_cached_tokens, out.num_computed_tokens
    if out.prompt_logprobs is not None:
        prev.prompt_logprobs = out.prompt_logprobs
    if prev.queue_s is None:
        prev.queue_s, prev.prefill_s = out.queue_s, out.prefill_s
    return prev
