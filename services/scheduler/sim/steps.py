"""What a worker's engine steps ran, summed: on the real mesh from the decode workers' /metrics
(the engine's step counters, engine/batchstats.py), in the simulator from its own state over time
(cluster.py). The fidelity report sets the two side by side: whether the sim's decode batch, its
padding and its step time are the mesh's at the same load.

Two kinds of step, as the engine counts them: `decode` steps run decode rows only; `prefill` steps
prefill prompts, with the running rows riding along. The simulator has no decode steps of its own
(a sequence decodes at the step time of its worker when its first token came, cluster.py), so it
counts them as its state implies: over a stretch of time with `n` running sequences (no prefill
step under way), dt / step_s steps, each of n rows padded to the longest context.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from ..policy import CostModel
from .meshcost import MeshCost

KINDS = ("decode", "prefill")
_METRICS = {"steps": "kvmesh_decode_model_steps_total", "rows": "kvmesh_decode_step_decode_rows_total",
            "padded": "kvmesh_decode_step_padded_kv_tokens_total", "seconds": "kvmesh_decode_engine_busy_seconds_total"}
_BETWEEN = "kvmesh_decode_engine_between_steps_seconds_total"
_SAMPLE = re.compile(r'^(\w+)\{kind="(\w+)"\}\s+(\S+)$')


@dataclass(slots=True)
class KindFigures:
    steps: float = 0.0
    rows: float = 0.0
    padded: float = 0.0   # KV tokens the steps' decode attention read (rows × the longest context)
    seconds: float = 0.0

    def add(self, other: KindFigures) -> None:
        self.steps += other.steps
        self.rows += other.rows
        self.padded += other.padded
        self.seconds += other.seconds


@dataclass(slots=True)
class StepFigures:
    decode: KindFigures = field(default_factory=KindFigures)
    prefill: KindFigures = field(default_factory=KindFigures)
    between: float = 0.0  # seconds the engine had sequences and was not in a step (the real mesh's only)

    def kind(self, name: str) -> KindFigures:
        return self.decode if name == "decode" else self.prefill

    def add(self, other: StepFigures) -> StepFigures:
        for name in KINDS:
            self.kind(name).add(other.kind(name))
        self.between += other.between
        return self

    def row(self, span_s: float) -> dict[str, float]:
        """The figures the report prints, for steps run over `span_s` seconds: the decode steps' mean
        rows, padded context per row and step time (ms), and each kind's busy fraction."""
        d = self.decode
        return {
            "rows": d.rows / d.steps if d.steps else math.nan,
            "context": d.padded / d.rows if d.rows else math.nan,
            "step_ms": 1e3 * d.seconds / d.steps if d.steps else math.nan,
            "decode_busy": d.seconds / span_s if span_s > 0 else math.nan,
            "prefill_busy": self.prefill.seconds / span_s if span_s > 0 else math.nan,
            "between": self.between / span_s if span_s > 0 else math.nan,
        }


def parse_metrics(text: str) -> StepFigures:
    """A decode worker's step counters from its /metrics text (Prometheus exposition format)."""
    names = {metric: what for what, metric in _METRICS.items()}
    figures = StepFigures()
    for line in text.splitlines():
        if line.startswith(_BETWEEN + " "):
            figures.between = float(line.split()[1])
        m = _SAMPLE.match(line)
        if m and m.group(1) in names and m.group(2) in KINDS:
            setattr(figures.kind(m.group(2)), names[m.group(1)], float(m.group(3)))
    return figures


def difference(after: StepFigures, before: StepFigures) -> StepFigures:
    """What ran between two readings of the same worker's counters."""
    out = StepFigures()
    for name in KINDS:
        a, b, o = after.kind(name), before.kind(name), out.kind(name)
        o.steps, o.rows, o.padded, o.seconds = a.steps - b.steps, a.rows - b.rows, a.padded - b.padded, a.seconds - b.seconds
    out.between = after.between - before.between
    return out


def tally_decode(figures: StepFigures, dt: float, step_s: float, rows: int, padded: float) -> None:
    """Adds `dt` seconds of decoding at `step_s` per step with `rows` running sequences and `padded`
    KV tokens per step (the simulator's counterpart of the engine's decode-step counters)."""
    if dt <= 0 or rows <= 0 or step_s <= 0:
        return
    steps = dt / step_s
    d = figures.decode
    d.steps += steps
    d.rows += steps * rows
    d.padded += steps * padded
    d.seconds += dt


def tally_prefill(figures: StepFigures, seconds: float, rows: int, padded: float, new_step: bool) -> None:
    """Adds a prefill step's time (or what a prompt joining it added) with its riding `rows`."""
    p = figures.prefill
    if new_step:
        p.steps += 1
        p.rows += rows
        p.padded += padded
    p.seconds += seconds


def without_stalls(figures: StepFigures, running_s: float, stalled_s: float) -> StepFigures:
    """`figures` with its decode tally (counted over all `running_s` seconds a worker had sequences)
    cut to the time they were not stalled (`stalled_s`: prefill steps, hand-backs, pauses): the
    same rows and padding per step and step time, fewer steps."""
    keep = max(0.0, running_s - stalled_s) / running_s if running_s > 0 else 0.0
    out = StepFigures(prefill=figures.prefill, between=figures.between)
    d, o = figures.decode, out.decode
    o.steps, o.rows, o.padded, o.seconds = d.steps * keep, d.rows * keep, d.padded * keep, d.seconds * keep
    return out


def step_slowdown(row: dict[str, float], cost: CostModel, mesh: MeshCost) -> float:
    """How much slower than the sim's costs a replay's own decode steps ran: their mean time (`row`:
    StepFigures.row) over the sim's step time for that many rows at that padded context (nan: no
    decode steps). Under a trace's mixed load (arrivals, prefills, hand-backs, other streams' SSE on
    the same cores) this is the host's speed and the interference together: in run AP 1.25-1.57x
    where the speed probe (hostspeed.py) just before said 0.90-1.04x."""
    rows, context, step_ms = (row.get(k, math.nan) for k in ("rows", "context", "step_ms"))
    if any(math.isnan(x) for x in (rows, context, step_ms)):
        return math.nan
    padded = rows * context
    model = mesh.step_s(cost, rows, padded, padded)
    return 1e-3 * step_ms / model if model > 0 else math.nan
