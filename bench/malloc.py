"""What the workers' fixed malloc mmap threshold costs the engine, measured side by side in one run.

    .venv/bin/python bench/malloc.py [--rounds 3] [--threshold-kib 4096]

Child processes run the same engine workload on the soak's ~22M model (bench/checkpoints.py):
one with glibc's default (dynamic) thresholds, one with the mmap threshold fixed the way workers fix
it (`malloc_mmap_threshold_kib`, with `heap.fix_mmap_threshold`, which fixes the trim threshold too),
and one with only the mmap threshold fixed (as workers did before: glibc's trim threshold then
stays at 128 KiB). The workload is a prefill worker's: prompts of distinct lengths (a new length
almost every step, like the soak's), one output token each; then a decode batch of 16 short
prompts, and one of 8 long ones (1,400 tokens: the steps' KV gathers are MiBs).
Children of the three sides take turns, two of each, and each side keeps its best round. Times are process CPU time
(user + system: the page faults of memory mapped afresh are system time), so load from other
processes moves them less. Also printed: each child's RSS peak and RSS after the run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path


SIDES = ("dynamic", "fixed", "mmap only")


def child(model: str, side: str, threshold_kib: int, rounds: int) -> None:
    import torch  # noqa: PLC0415

    from kvmesh.engine.llm import EngineConfig, LLMEngine  # noqa: PLC0415
    from kvmesh.engine.sampling import SamplingParams  # noqa: PLC0415
    from kvmesh.runtime.heap import _LIBC, M_MMAP_THRESHOLD, fix_mmap_threshold, heap_bytes, release_free_pages  # noqa: PLC0415

    if side == "fixed":
        fix_mmap_threshold(threshold_kib * 1024)
    elif side == "mmap only" and _LIBC is not None:
        _LIBC.mallopt(M_MMAP_THRESHOLD, threshold_kib * 1024)
    torch.set_num_threads(1)
    engine = LLMEngine(EngineConfig(model=model, device="cpu", dtype="float32", enable_prefix_caching=False))
    one = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    lengths = [97 + 61 * i for i in range(24)]  # 97 .. 1500 tokens, all different
    decode = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    best_prefill, best_decode, best_long = float("inf"), float("inf"), float("inf")
    for r in range(rounds):
        t0 = time.process_time()
        for n in lengths:
            engine.generate([[(7 * i + r) % 250 + 1 for i in range(n)]], one)
        best_prefill = min(best_prefill, time.process_time() - t0)
        t0 = time.process_time()
        engine.generate([[(3 * i + b) % 250 + 1 for i in range(64)] for b in range(16)], decode)
        best_decode = min(best_decode, time.process_time() - t0)
        t0 = time.process_time()
        engine.generate([[(5 * i + b) % 250 + 1 for i in range(1400)] for b in range(8)], decode)
        best_long = min(best_long, time.process_time() - t0)
    rss_mib = int(Path("/proc/self/status").read_text().split("VmRSS:")[1].split()[0]) / 1024
    hwm_mib = int(Path("/proc/self/status").read_text().split("VmHWM:")[1].split()[0]) / 1024
    release_free_pages()
    print(json.dumps({"prefill_s": best_prefill, "prefill_tokens": sum(lengths), "decode_s": best_decode, "long_s": best_long,
                      "rss_mib": rss_mib, "hwm_mib": hwm_mib, "heap": heap_bytes()}))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threshold-kib", type=int, default=4096, help="the fixed threshold to compare (workers: 4096)")
    ap.add_argument("--child", nargs=3, metavar=("MODEL", "SIDE", "THRESHOLD_KIB"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child[0], args.child[1], int(args.child[2]), args.rounds)
        return 0
    sys.path.insert(0, str(Path(__file__).parent))
    from checkpoints import SMALL_LLAMA_BYTES, build_llama  # noqa: PLC0415

    with tempfile.TemporaryDirectory() as tmp:
        model = str(build_llama(Path(tmp), **SMALL_LLAMA_BYTES)[1])
        runs: dict[str, list[dict]] = {side: [] for side in SIDES}
        for _ in range(2):  # NOTE: two children per side, in turn, so drift hits every side alike
            for side in SIDES:
                out = subprocess.run([sys.executable, __file__, "--rounds", str(args.rounds), "--child", model, side,
                                      str(args.threshold_kib)], check=True, capture_output=True, text=True).stdout
                runs[side].append(json.loads(out.strip().splitlines()[-1]))
    best = {side: {k: min(r[k] for r in rs) for k in ("prefill_s", "decode_s", "long_s", "rss_mib", "hwm_mib")}
            for side, rs in runs.items()}
    tokens = runs["dynamic"][0]["prefill_tokens"]
    labels = {"dynamic": "glibc dynamic", "fixed": f"fixed {args.threshold_kib} KiB",
              "mmap only": f"mmap {args.threshold_kib} KiB only"}
    print(f"{'thresholds':<24}{'prefill µs/token':>18}{'decode 16 × 64 s':>18}{'decode 8 × 1400 s':>19}{'RSS MiB':>9}"
          f"{'peak MiB':>10}")
    for side, b in best.items():
        print(f"{labels[side]:<24}{1e6 * b['prefill_s'] / tokens:>18.1f}{b['decode_s']:>18.3f}{b['long_s']:>19.3f}"
              f"{b['rss_mib']:>9.0f}{b['hwm_mib']:>10.0f}")
    for side in SIDES[1:]:
        print(f"{side} / dynamic CPU time: prefill {best[side]['prefill_s'] / best['dynamic']['prefill_s']:.2f}x, "
              f"decode {best[side]['decode_s'] / best['dynamic']['decode_s']:.2f}x, "
              f"long decode {best[side]['long_s'] / best['dynamic']['long_s']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
