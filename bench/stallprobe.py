"""Does a short prefill stall the streams beside it as long, in proportion, as a long one?

    nice -n 5 .venv/bin/python bench/stallprobe.py

Starts `kvmesh up --decode 1 --prefill 0` on tiny and runs `kvmesh sim calibrate`'s CPU-sharing probe
(`_Prober.stall`: an uncached prompt arriving alone, then beside 8 decoding streams) at more prompt
lengths than the calibration uses, 5 repeats taking turns; prints the medians and the streams' extra
gap over the step's time as the fit reads it (`prefill_stall`, meshcal.py), taking the request's
overhead and work as run AE's 13.8 ms.
"""
import asyncio, statistics, sys, tempfile, time
from kvmesh.runtime.launcher import MeshOptions, free_port
from kvmesh.runtime.supervisor import Mesh
from kvmesh.scheduler.sim.client import Target, new_client, served_model
from kvmesh.scheduler.sim.meshprobe import ProbeConfig, _Prober

LENGTHS = (64, 128, 256, 512, 1536); K = 8; REPEATS = 5

async def main(url):
    target = Target(url)
    async with new_client(target) as client:
        p = _Prober(client, target, await served_model(client, target), ProbeConfig())
        for _ in range(3):
            await p.one(p.prompt(32), 4)
        rows = {}
        for rep in range(REPEATS):
            for n in LENGTHS:
                for k in (0, K):
                    r = await p.stall(k, n)
                    rows.setdefault((n, k), []).append(r)
                    await asyncio.sleep(0.3)
        print("tokens | lone TTFT ms | TTFT beside 8 ms | streams' extra gap (gap - ITL) ms | extra gap / (TTFT beside - 13.8 ms)")
        for n in LENGTHS:
            lone = statistics.median(r[4] for r in rows[(n, 0)])
            beside = statistics.median(r[4] for r in rows[(n, K)])
            extra = statistics.median(r[2] - r[3] for r in rows[(n, K)])
            print(f"{n:6d} | {lone*1e3:6.1f} | {beside*1e3:6.1f} | {extra*1e3:6.1f} | {extra / max(1e-3, beside - 0.0138):.2f}")

with tempfile.TemporaryDirectory() as d:
    mesh = Mesh(MeshOptions(model="tiny", port=free_port(), run_dir=d, prefill=0, decode=1))
    mesh.start(timeout_s=180)
    try:
        asyncio.run(main(mesh.gateway_url))
    finally:
        mesh.stop()
