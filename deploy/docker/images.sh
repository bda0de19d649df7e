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
  docker image inspect "$base" >/dev/null 2>&1 || deploy/docker/debian-base.sh "$base"
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
docker image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep -E '^kvmesh(-prometheus)?:local '
