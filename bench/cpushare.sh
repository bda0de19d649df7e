#!/bin/bash
# What another process costs the in-process engine, by where it runs: the engine's CPU per output
# token (tiny, 128 requests x 128 tokens, 32 at a time) pinned to CPU 0, alone, beside a busy
# Python loop on CPU 1, beside memory copies on CPU 1, and beside a busy loop time-sharing CPU 0.
# Why it exists: `kvmesh up --pin-engines` (docs/cpu-pinning.md). Needs taskset and 2+ CPUs.
#   bench/cpushare.sh [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
eng() {
  taskset -c 0 "$PY" bench/tokcost.py --engine-child --model tiny --requests 128 --concurrency 32 --max-tokens 128 |
    tail -1 | "$PY" -c "import json, sys; r = json.load(sys.stdin); print(f'{1e6 * r[\"cpu_s\"] / r[\"tokens\"]:6.1f} us/token  {r[\"tokens\"] / r[\"wall_s\"]:6.0f} tok/s')"
}
beside() {  # beside CPU CODE: the engine's figures while CODE runs on CPU
  taskset -c "$1" "$PY" -c "$2" & local other=$!
  sleep 1
  eng
  kill "$other"; wait "$other" 2>/dev/null || true
}
BUSY='x = 0
while True: x += 1'
copy() { echo "import numpy as np
a = np.ones(($1) // 8); b = np.empty_like(a)
while True: np.copyto(b, a)"; }
for round in $(seq "${1:-2}"); do
  echo "round $round"
  echo -n "alone on CPU 0:                     "; eng
  echo -n "a busy loop on CPU 1:               "; beside 1 "$BUSY"
  echo -n "64 MiB copies on CPU 1:             "; beside 1 "$(copy '64 << 20')"
  echo -n "1 MiB copies on CPU 1:              "; beside 1 "$(copy '1 << 20')"
  echo -n "a busy loop time-sharing CPU 0:     "; beside 0 "$BUSY"
done
