"""What the engine's steps ran, summed by kind: steps that only decode, and steps that prefill
(decode rows ride along with them). For each: the steps, their decode rows, the KV tokens their
decode attention read, their wall time and the CPU time of the thread that ran them (EngineStats;
the decode worker's /metrics; `kvmesh sim`'s fidelity report sets them beside the simulator's own;
bench/tokcost.py sets a mesh engine's step CPU beside the in-process engine's)."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvmesh.engine.scheduler import ScheduledSeq


def decode_contexts(scheduled: list[ScheduledSeq]) -> list[int]:
    """The context of each decode row of a step (a row computing one new token, as the runner
    groups them): its computed tokens plus the new one."""
    return [s.start + 1 for s in scheduled if s.num_new_tokens == 1]


def padded_kv_tokens(contexts: list[int]) -> int:
    """KV tokens a decode group reads: every row padded to the longest (engine/attention.py)."""
    return len(contexts) * max(contexts, default=0)


@dataclass(slots=True)
class KindCounters:
    steps: int = 0
    rows: int = 0
    padded_kv_tokens: int = 0
    micros: int = 0
    cpu_micros: int = 0  # the stepping thread's CPU time (on CUDA: the host's side of the step)


@dataclass(slots=True)
class BatchCounters:
    decode: KindCounters = field(default_factory=KindCounters)   # steps with decode rows only
    prefill: KindCounters = field(default_factory=KindCounters)  # steps that prefill (rows ride along)
    between_micros: int = 0  # time from a step that left sequences unfinished to the next step
    ended: float | None = None  # when the last step ended, if it left sequences unfinished

    def started(self, now: float) -> None:
        """A step starts at `now` (perf_counter): the time since the last one ended, if that left
        work, is time the engine had sequences and did not step (its loop's commands, the GIL)."""
        if self.ended is not None:
            self.between_micros += round((now - self.ended) * 1e6)
        self.ended = None

    def finished(self, now: float, more: bool) -> None:
        self.ended = now if more else None

    def add(self, scheduled: list[ScheduledSeq], seconds: float, cpu_seconds: float = 0.0) -> None:
        contexts = decode_contexts(scheduled)
        kind = self.decode if len(contexts) == len(scheduled) else self.prefill
        kind.steps += 1
        kind.rows += len(contexts)
        kind.padded_kv_tokens += padded_kv_tokens(contexts)
        kind.micros += round(seconds * 1e6)
        kind.cpu_micros += round(cpu_seconds * 1e6)

    def as_fields(self) -> dict[str, int]:
        """EngineStats' fields for these counters."""
        return {f"{name}_{what}": getattr(kind, attr)
                for name, kind in (("decode", self.decode), ("prefill", self.prefill))
                for what, attr in (("steps", "steps"), ("step_rows", "rows"),
                                   ("step_padded_kv_tokens", "padded_kv_tokens"), ("step_micros", "micros"),
                                   ("step_cpu_micros", "cpu_micros"))} | {
            "between_steps_micros": self.between_micros}
