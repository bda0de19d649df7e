#!/usr/bin/env bash
# Builds kvmesh:local (./Dockerfile) and kvmesh-prometheus:local (compose.test.yaml's Prometheus)
# on BASE_IMAGE (default python:3.11-slim). Where BASE_IMAGE is neither present nor pullable, a
# base is built from Debian's packages once (deploy/docker/debian-base.sh) and kept as
# kvmesh-base:bookworm for later runs. deploy/pip/ gets this host's pip CA bundle and torch
# wheel (from `pip config` / PIP_CERT / PIP_FIND_LINKS) when it has them, so the build works
# behind a TLS-intercepting proxy or without the torch index.
set -euo pipefail
cd "$(dirname "$0")/../.."
base=${BASE_IMAGE:-python:3.11-slim}
local_base=kvmesh-base:bookworm
torch_spec=$(sed -n 's/^TORCH_SPEC ?= *//p' Makefile)

if docker image inspect "$base" >/dev/null 2>&1; then :
elif timeout 60 docker pull -q "$base" >/dev/null 2>&1; then echo "images: pulled $base"
else
  echo "images: $base cannot be pulled; using $local_base from Debian's packages"
  base=$local_base
  docker image inspect "$base" >/dev/null 2>&1 || { deploy/docker/debian-base.sh "$base"; echo "images: base built in $SECONDS s"; }
fi

pip_setting() {  # the host's pip setting NAME (env first, then pip's config files)
  local env_name="PIP_$(echo "$1" | tr a-z- A-Z_)"
  if [ -n "${!env_name:-}" ]; then echo "${!env_name}"; return; fi
  python3 -m pip config list 2>/dev/null | sed -n "s/^[a-z]*\.$1='\(.*\)'$/\1/p" | tail -1
}
cert=$(pip_setting cert)
mkdir -p deploy/pip/wheels
if [ -n "$cert" ] && [ -s "$cert" ]; then cp "$cert" deploy/pip/ca.crt; else rm -f deploy/pip/ca.crt; fi
torch_index_url=${KVMESH_TORCH_INDEX_URL-https://download.pytorch.org/whl/cpu}
version=${torch_spec#torch==}
for dir in $(pip_setting find-links); do
  for wheel in "${dir#file://}"/torch-"$version"*.whl; do
    [ -f "$wheel" ] || continue
    [ -f "deploy/pip/wheels/$(basename "$wheel")" ] || cp "$wheel" deploy/pip/wheels/
    torch_index_url=""  # NOTE: the wheel at hand; no torch index needed
  done
done
# Every wheel the image installs, fetched here first through this host's own pip setup (its
# local indexes, find-links and cache), so the build's pip runs offline (--no-index) and a
# brand-new machine downloads each wheel once, not once for the host and again in the build.
# The same steps as the Dockerfile: torch; the requirements but xgrammar, and the build backend;
# xgrammar without its dependencies, then those but triton. When any step fails, the build uses
# the index instead.
stage_wheels() {
  local req dest=deploy/pip/wheels
  req=$(mktemp -d)
  python3 -c "import tomllib; print(*tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies'], sep='\n')" \
    > "$req/all.txt" || return 1
  grep -v '^xgrammar' "$req/all.txt" > "$req/others.txt"
  python3 -c "import tomllib; print(*tomllib.load(open('pyproject.toml', 'rb'))['build-system']['requires'], sep='\n')" \
    >> "$req/others.txt" || return 1  # NOTE: the project's own build (`pip install .`) runs offline too
  echo "$torch_spec" > "$req/torch.txt"  # NOTE: else `torch>=2.4` resolves to the newest (a CUDA build)
  download() { python3 -m pip download --quiet --log "$req/pip.log" --only-binary=:all: --dest "$dest" --find-links "$dest" \
    --python-version 3.11 --implementation cp --abi cp311 --abi abi3 --abi none -c "$req/torch.txt" "$@" 2>/dev/null; }  # the image's CPython
  download "$torch_spec" ${torch_index_url:+--index-url "$torch_index_url"} \
    && download pip -r "$req/others.txt" \
    && download --no-deps "$(grep '^xgrammar' "$req/all.txt")" \
    && python3 - "$dest" > "$req/xgrammar.txt" <<'PY' \
    && download -r "$req/xgrammar.txt"
import email.parser, pathlib, sys, zipfile
wheel = sorted(pathlib.Path(sys.argv[1]).glob("xgrammar-*.whl"))[-1]
with zipfile.ZipFile(wheel) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    reqs = email.parser.Parser().parsestr(z.read(meta).decode()).get_all("Requires-Dist") or []
print(*(r for r in reqs if "extra ==" not in r and not r.startswith("triton")), sep="\n")
PY
  local rc=$?
  [ $rc = 0 ] || grep -E '^(ERROR|  ERROR)|No matching distribution' "$req/pip.log" | tail -5 >&2
  rm -rf "$req"
  return $rc
}
# NOTE: staged once per requirements, torch pin and torch index (kept in COMPLETE): a warm run skips it.
stamp=$({ cat pyproject.toml; echo "$torch_spec $torch_index_url"; } | sha256sum | cut -c1-16)
t_wheels=$SECONDS
if [ "$(cat deploy/pip/wheels/COMPLETE 2>/dev/null)" = "$stamp" ]; then
  echo "images: the wheels in deploy/pip/wheels are staged for these requirements; the build runs pip offline"
elif rm -f deploy/pip/wheels/COMPLETE && stage_wheels; then
  echo "$stamp" > deploy/pip/wheels/COMPLETE
  echo "images: $(ls deploy/pip/wheels/*.whl | wc -l) wheels staged in deploy/pip/wheels in $((SECONDS - t_wheels)) s; the build runs pip offline"
else
  echo "images: staging wheels failed; the build's pip uses the index"
fi

extra=""
for url in $(pip_setting extra-index-url); do
  case $url in http://*|https://*) extra="$extra $url" ;; esac  # file:// indexes are this host's only
done

logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
build() {  # LOG ARGS...: `docker build ARGS...`, its output (in LOG) shown only when it fails
  local log=$1
  shift
  docker build "$@" >"$log" 2>&1 || { tail -40 "$log" >&2; echo "images: docker build $* failed" >&2; return 1; }
}
# NOTE: side by side: the Prometheus image is mostly apt downloads, kvmesh's mostly pip's.
echo "images: building kvmesh:local and kvmesh-prometheus:local on $base"
build "$logs/prometheus" -t kvmesh-prometheus:local --build-arg BASE_IMAGE="$base" \
  -f deploy/docker/prometheus.Dockerfile deploy/docker &
prometheus=$!
build "$logs/kvmesh" -t kvmesh:local \
  --build-arg BASE_IMAGE="$base" \
  --build-arg TORCH_INDEX_URL="$torch_index_url" \
  --build-arg PIP_INDEX_URL="$(pip_setting index-url | grep -E '^https?://' || true)" \
  --build-arg PIP_EXTRA_INDEX_URL="${extra# }" \
  . || { wait "$prometheus"; exit 1; }
wait "$prometheus"
echo "images: built in $SECONDS s"
docker image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep -E '^kvmesh(-prometheus)?:local '
