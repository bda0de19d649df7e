#!/bin/bash
# The GPU checks in one script, for a machine with a CUDA device and a bare Python that has torch,
# triton, transformers, safetensors, tokenizers and jinja2 but no kvmesh and no pytest (the device
# machine the sessions are lent): the CUDA-marked engine tests, then bench/gpu.py. Each result goes
# to its own file under $OUT (default ./device-out), and a summary line a step to stdout.
#
#   bash bench/device.sh --fetch   # here, with network: pytest's wheels into .device-wheels/ (git-ignored)
#   bash bench/device.sh           # there, from the repository root, with .device-wheels/ carried along
#
# Without a CUDA device it runs the same steps as a dry run: the CUDA tests skip, bench/gpu.py
# --smoke. Time limits (seconds): TESTS_S (default 240), BENCH_S (420).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
wheels="$root/.device-wheels"
py=${PYTHON:-python3}

if [ "${1:-}" = "--fetch" ]; then
  "$py" -m pip download --only-binary=:all: --python-version 3.12 -d "$wheels" pytest
  exit
fi

out=${OUT:-$root/device-out}
mkdir -p "$out"
cd "$root"
site=$(mktemp -d)
trap 'rm -rf "$site"' EXIT
"$py" -m pip install --quiet --no-index --find-links "$wheels" --target "$site/lib" pytest > "$out/pip.txt" 2>&1 \
  || { echo "pytest did not install from $wheels (run --fetch where there is network): see $out/pip.txt"; exit 1; }
if ! "$py" -c "import kvmesh.engine" 2> /dev/null; then
  ln -s "$root/services" "$site/kvmesh"  # this checkout's services/ as the kvmesh package
fi
export PYTHONPATH="$site:$site/lib${PYTHONPATH:+:$PYTHONPATH}"

{ if command -v nvidia-smi > /dev/null; then nvidia-smi -L; fi; "$py" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"; } \
  > "$out/device.txt"
cat "$out/device.txt"
cuda=$("$py" -c "import torch; print(int(torch.cuda.is_available()))")

# NOTE: --confcutdir keeps tests/conftest.py (it starts nats-server, needs grpc) out: the engine's
# tests need only tests/engine/conftest.py. addopts is emptied so that `-m cuda` is the only filter.
timeout "${TESTS_S:-240}" "$py" -m pytest -p no:cacheprovider --confcutdir=tests/engine -o addopts= -m cuda -q -rs \
  tests/engine > "$out/tests.txt" 2>&1
echo "CUDA tests: exit $? ($(tail -1 "$out/tests.txt"))"

if [ "$cuda" = 1 ]; then bench=(bench/gpu.py); else bench=(bench/gpu.py --smoke); fi
timeout "${BENCH_S:-420}" "$py" "${bench[@]}" > "$out/gpu.txt" 2>&1
echo "${bench[*]}: exit $? (figures in $out/gpu.txt)"
