"""Sim vs real, request by request: where the real TTFTs spread that the simulator's do not.

    .venv/bin/python bench/simrequests.py PREFIX.1w.50.jsonl [...]

`bench/simfidelity.py --save-requests PREFIX` writes one JSONL file per mesh and load: a row per
trace request with its shape (turn, prompt and uncached tokens), the sim's TTFT and the TTFT of each
real replay. This prints, for the requests in the figures' window, TTFT p50/p90 sim vs real grouped
by what might explain the spread: uncached tokens, turn, and how many requests were already waiting
for their first token when it arrived (in the sim and in the replay).
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Iterable

from kvmesh.scheduler.sim.report import quantile


def waiting_at_arrival(arrivals: list[float], firsts: list[float]) -> list[int]:
    """For each request, how many others had arrived and not yet had their first token when it arrived."""
    return [sum(1 for a, f in zip(arrivals, firsts, strict=True) if a < t < f) for t in arrivals]


def rows(trace, sim_results, real_outcomes: list[list], matched_results=None) -> list[dict]:  # noqa: ANN001 - sim types
    """One dict per trace request (trace order): its shape, the sim's outcome (and the sim's matched to the
    host's speed during the replays, if given) and each replay's."""
    by_id = {r.request.request_id: r for r in sim_results}
    matched = {r.request.request_id: r for r in matched_results or ()}
    turns: dict[str, int] = {}
    sims = [by_id[r.request_id] for r in trace]
    out = []
    sim_waiting = waiting_at_arrival([s.request.arrival_s for s in sims], [s.first_token_s for s in sims])
    real_waiting = [waiting_at_arrival([o.arrival_s for o in outcomes], [o.first_token_s for o in outcomes])
                    for outcomes in real_outcomes]
    for i, (r, s) in enumerate(zip(trace, sims, strict=True)):
        turns[r.session_id] = turns.get(r.session_id, 0) + 1
        out.append({
            "i": i, "arrival_s": r.arrival_s, "session": r.session_id, "turn": turns[r.session_id],
            "prompt_tokens": r.prompt_tokens, "output_tokens": r.output_tokens,
            "sim": {"ttft_s": s.ttft_s if s.status == 200 else None, "cached": s.cached_tokens,
                    "waiting": sim_waiting[i], "worker": s.decode_id, "first_s": s.first_token_s, "finish_s": s.finish_s,
                    "matched_ttft_s": matched[r.request_id].ttft_s if r.request_id in matched else None},
            "real": [{"ttft_s": o.ttft_s if o.ok else None, "cached": o.cached_tokens, "waiting": w[i],
                      "sent_s": o.arrival_s, "first_s": o.first_token_s, "finish_s": o.finish_s}
                     for o, w in zip((outcomes[i] for outcomes in real_outcomes), real_waiting, strict=True)],
        })
    return out


def write(path: str, data: list[dict], window: tuple[float, float], slowdowns: list[float | None] = ()) -> None:
    """`slowdowns`: each replay's host time over the calibration's, measured just before it (None: not measured)."""
    with open(path, "w") as f:
        f.write(json.dumps({"window": list(window), "slowdowns": list(slowdowns)}) + "\n")
        for row in data:
            f.write(json.dumps(row) + "\n")


def read(path: str) -> tuple[tuple[float, float], list[dict]]:
    with open(path) as f:
        head, *body = (json.loads(line) for line in f if line.strip())
    return tuple(head["window"]), body


def pq(values: list[float | None], q: float) -> float:
    """The sim's quantile (report.quantile) of the values known (a failed request's TTFT is None)."""
    return quantile([v for v in values if v is not None], q)


def table(data: list[dict], name: str, key: Callable[[dict], object]) -> Iterable[str]:
    """TTFT p50 / p90 (ms) by `key`, sim vs each replay pooled."""
    groups: dict[object, list[dict]] = {}
    for row in data:
        groups.setdefault(key(row), []).append(row)
    yield f"{name:>16} {'n':>4} | {'sim p50':>8} {'p90':>6} | {'real p50':>8} {'p90':>6} | {'real/sim p50':>12} {'p90':>6}"
    for k in sorted(groups, key=lambda x: (str(type(x)), x)):
        g = groups[k]
        sim = [r["sim"]["ttft_s"] for r in g]
        real = [x["ttft_s"] for r in g for x in r["real"]]
        s50, s90, r50, r90 = (1e3 * pq(sim, 0.5), 1e3 * pq(sim, 0.9), 1e3 * pq(real, 0.5), 1e3 * pq(real, 0.9))
        yield (f"{k!s:>16} {len(g):>4} | {s50:>8.1f} {s90:>6.1f} | {r50:>8.1f} {r90:>6.1f} | "
               f"{r50 / s50 if s50 else math.nan:>12.2f} {r90 / s90 if s90 else math.nan:>6.2f}")


def bucket(value: float, edges: tuple[int, ...]) -> str:
    for lo, hi in zip(edges, edges[1:]):
        if lo <= value < hi:
            return f"{lo}-{hi - 1}"
    return f">={edges[-1]}"


def uncached(row: dict) -> float:
    real = [row["prompt_tokens"] - x["cached"] for x in row["real"]]
    return sum(real) / len(real)


def report(path: str) -> Iterable[str]:
    window, all_rows = read(path)
    data = [r for r in all_rows if window[0] <= r["arrival_s"] < window[1]]
    yield f"# {path}: {len(data)} requests in the window {window[0]:g}..{window[1]:g} s"
    yield from table(data, "all", lambda r: "all")
    yield from table(data, "uncached (real)", lambda r: bucket(uncached(r), (0, 64, 128, 256, 512, 1024)))
    yield from table(data, "sim - real uncached", lambda r: bucket(r["prompt_tokens"] - r["sim"]["cached"] - uncached(r),
                                                                  (-2048, -16, 16, 2048)))
    yield from table(data, "turn", lambda r: min(r["turn"], 3))
    yield from table(data, "waiting (sim)", lambda r: min(r["sim"]["waiting"], 3))
    real_waiting = [(x["waiting"], x["ttft_s"]) for r in data for x in r["real"]]
    yield "# real TTFT p50 / p90 (ms) by requests waiting for their first token when it arrived (real):"
    for w in range(4):
        ttfts = [t for n, t in real_waiting if min(n, 3) == w]
        yield f"#   {w}{'+' if w == 3 else ' '} n {len(ttfts):>4}: {1e3 * pq(ttfts, 0.5):.1f} / {1e3 * pq(ttfts, 0.9):.1f}"
    if all_rows and "sent_s" in all_rows[0]["real"][0]:
        yield from residuals(data, all_rows)


def context(run: list[dict], k: int) -> dict[str, int]:
    """What else the real mesh was doing around request k of one replay (`run`: that replay's rows)."""
    me = run[k]
    t, end = me["sent_s"], me["first_s"]
    others = [x for j, x in enumerate(run) if j != k and x["ttft_s"] is not None]
    return {
        "streams at arrival": sum(1 for x in others if x["first_s"] <= t < x["finish_s"]),
        "others' first tokens during its TTFT": sum(1 for x in others if t < x["first_s"] < end),
        "finishes during its TTFT": sum(1 for x in others if t - 0.005 < x["finish_s"] < end),
        "arrivals 20 ms before": sum(1 for x in others if t - 0.02 <= x["sent_s"] < t),
    }


def residuals(data: list[dict], all_rows: list[dict]) -> Iterable[str]:
    """real TTFT / the sim's matched to the host's speed (or the sim's), grouped by what the mesh was doing."""
    runs = len(all_rows[0]["real"]) if all_rows else 0
    inside = {r["i"] for r in data}
    points: list[tuple[dict[str, int], float]] = []
    for n in range(runs):
        run = [r["real"][n] for r in all_rows]
        for k, r in enumerate(all_rows):
            sim = r["sim"]["matched_ttft_s"] or r["sim"]["ttft_s"]
            if r["i"] in inside and run[k]["ttft_s"] is not None and sim:
                points.append((context(run, k), run[k]["ttft_s"] / sim))
    if not points:
        return
    yield "# real TTFT / the sim's (matched to the host's speed where measured), p50 / p90, by what the real mesh was doing:"
    for name in points[0][0]:
        groups: dict[int, list[float]] = {}
        for ctx, ratio in points:
            groups.setdefault(min(ctx[name], 4), []).append(ratio)
        yield f"#   {name}: " + ", ".join(f"{k}{'+' if k == 4 else ''}: {pq(v, 0.5):.2f} / {pq(v, 0.9):.2f} (n {len(v)})"
                                          for k, v in sorted(groups.items()))


def main(argv: list[str]) -> int:
    for path in argv:
        for line in report(path):
            print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
