#!/usr/bin/env bash
# `make test-compose`: compose.yaml under a real Docker engine. Installs Debian's docker.io and
# docker-compose when missing, starts dockerd when none runs (and stops it afterwards), builds the
# images (deploy/docker/images.sh), then runs tests/compose/ against compose.yaml + compose.test.yaml.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
. deploy/docker/engine.sh

t0=$SECONDS
docker_tools
echo "test-compose: docker.io and docker-compose ready after $((SECONDS - t0)) s"
engine_start
trap engine_stop EXIT
deploy/docker/images.sh
echo "test-compose: images ready after $((SECONDS - t0)) s; running tests/compose with $(compose_tool)"
"$PY" -m pytest tests/compose -m compose -p no:cacheprovider -o timeout=900 -q -rA "$@"
echo "test-compose: done in $((SECONDS - t0)) s"
