#!/bin/bash
# This checkout's bench/tokcost.py on another checkout's kvmesh ("before") and on this one ("after"), alternating.
#
#   ROUNDS=2 bench/tokcost-ab.sh /path/to/before-checkout [tokcost.py args]   (ROUNDS: even, default 2)
#
# The before side runs its own `kvmesh` package (put first on PYTHONPATH) with this checkout's
# virtualenv and this checkout's bench/tokcost.py, so both sides are measured the same way. BLOCK_HTTPTOOLS=1 hides httptools from it, so its uvicorn runs on h11 the way a
# checkout without the httptools dependency did. Run from this checkout's root.
set -euo pipefail
before=$(cd "$1" && pwd); shift
path=$(mktemp -d)
trap 'rm -rf "$path"' EXIT
ln -s "$before/services" "$path/kvmesh"
if [ "${BLOCK_HTTPTOOLS:-0}" = 1 ]; then
  echo 'raise ImportError("hidden by tokcost-ab.sh: the before side runs uvicorn on h11")' > "$path/httptools.py"
fi
before_run() { echo "=== before, round $1: $(uptime)"; PYTHONPATH="$path" nice -n 5 .venv/bin/python bench/tokcost.py "${@:2}"; }
after_run() { echo "=== after, round $1: $(uptime)"; nice -n 5 .venv/bin/python bench/tokcost.py "${@:2}"; }
# NOTE: the order alternates (before-after, then after-before, ...): of two runs back to back the
# second read ~0.05 higher (mesh total / engine at c=64) with the same code on both sides (stop 63,
# four null pairs), so a fixed order counted that against "after". Use an even ROUNDS.
for round in $(seq 1 "${ROUNDS:-2}"); do
  if [ $((round % 2)) = 1 ]; then before_run "$round" "$@"; after_run "$round" "$@"
  else after_run "$round" "$@"; before_run "$round" "$@"; fi
done
