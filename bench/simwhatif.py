"""What-ifs on a saved `bench/simfidelity.py --save-samples PREFIX` probe set: refit it, change terms,
and print the sim's capacity and TTFTs, without a mesh (the sim is deterministic, so a busy host
does not move these figures).

    .venv/bin/python bench/simwhatif.py PREFIX.2w.json [--rates 15.6,25] [--set host_parallelism=2 ...]
        [--noise fitted|beside|lone] [--engine-decode-s-per-seq 1.68e-05]

Each `--set` is a MeshCalibration field (meshcal.py) and its value, applied after the fit; several
`--set` apply together. `--noise` replaces the fitted `--ttft-noise` (the path-load probe's spread
around the sim's, pathload.residual_noise) with the spread of the TTFTs beside decoding streams
(meshcal.ttft_noise, the fit's before stop 44) or of the lone TTFTs. The trace, SLO and sim settings are simfidelity's.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

import simfidelity

from kvmesh.scheduler.sim.meshcal import MeshCalibration, Samples, fit, ttft_noise
from kvmesh.scheduler.sim.meshstats import around_median, noise_quantiles


def load_samples(path: str) -> Samples:
    """A `--save-samples` file back as Samples (its JSON lists of points back as tuples)."""
    with open(path) as f:
        raw = json.load(f)
    return Samples(**{k: [tuple(x) if isinstance(x, list) else x for x in v] if isinstance(v, list) else v
                      for k, v in raw.items()})


def changed(cal: MeshCalibration, samples: Samples, assignments: list[str], noise: str) -> MeshCalibration:
    fields = {f.name for f in dataclasses.fields(MeshCalibration)}
    for item in assignments:
        name, sep, value = item.partition("=")
        if not sep or name not in fields:
            raise SystemExit(f"--set {item!r}: expected FIELD=VALUE with FIELD one of {', '.join(sorted(fields))}")
        cal = dataclasses.replace(cal, **{name: float(value)})
    if noise == "lone":
        cal = dataclasses.replace(cal, noise=noise_quantiles(around_median(samples.ttft)))
    elif noise == "beside":
        cal = dataclasses.replace(cal, noise=ttft_noise(samples))
    return cal


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("samples", help="a PREFIX.<N>w.json file from simfidelity --save-samples")
    p.add_argument("--rates", default="", help="comma-separated rates (req/s) to simulate")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE")
    p.add_argument("--policies", default="kv_aware",
                   help="comma-separated policies to simulate at each rate (the capacity is kv_aware's); with several, "
                   "sessions are not sticky, as in simfidelity's policy ordering")
    p.add_argument("--noise", choices=["fitted", "beside", "lone"], default="fitted")
    p.add_argument("--engine-decode-s-per-seq", type=float, default=None,
                   help="the in-process lower bound's per-sequence decode cost (simfidelity prints it); splits the ITL slope")
    p.add_argument("--slo-ttft-s", type=float, default=0.5)
    p.add_argument("--duration-s", type=float, default=40.0, help="simfidelity's (runs before BA: 16)")
    p.add_argument("--warmup-s", type=float, default=6.0, help="simfidelity's (runs before BA: 4)")
    args = p.parse_args(argv)
    samples = load_samples(args.samples)
    workers = max(1, samples.workers)
    cal = changed(fit(samples, args.engine_decode_s_per_seq), samples, args.set, args.noise)
    bench = simfidelity.Bench(args)
    config = bench.sim_config(workers, *simfidelity.sim_costs(cal, workers))
    cap = bench.capacity_of(lambda r: bench.sim("kv_aware", config, r), 2.0 * workers, 4)
    print(f"{args.samples}: {workers} worker(s), {' '.join(args.set) or 'as fitted'}, {args.noise} noise: "
          f"sim capacity {cap:.2f} req/s")
    policies = [p for p in args.policies.split(",") if p]
    if len(policies) > 1:
        config = dataclasses.replace(config, sticky_ttl_s=0.0)
    for rate in (float(x) for x in args.rates.split(",") if x):
        for policy in policies:
            s = bench.sim(policy, config, rate)
            print(f"  {rate:7.2f} req/s{'' if len(policies) == 1 else ' ' + policy}: TTFT p50 {s.ttft_p50_s:.3f} "
                  f"p90 {s.ttft_p90_s:.3f} p99 {s.ttft_p99_s:.3f}, ITL p50 {s.itl_p50_s * 1e3:.2f} ms, hit {s.hit_rate:.2f}")
            print(f"           {simfidelity.step_line(s, [])}")
            if len(policies) > 1:  # as simfidelity's policy order: the sim at each of its host speeds
                draws = [bench.sim(policy, simfidelity.scaled_config(config, f), rate) for f in simfidelity.SIM_SPEEDS]
                print(f"           p90 at the host's time {'/'.join(f'{f:g}' for f in simfidelity.SIM_SPEEDS)}x: "
                      f"{'/'.join(f'{d.ttft_p90_s:.3f}' for d in draws)}, busiest worker's share "
                      f"{'/'.join(simfidelity.busiest(d) for d in draws)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
