# kvmesh: `make up` runs the mesh on the built-in tiny model; `make test` runs the test suite.
# Both create and use a virtualenv at .venv/ in the repo.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# NOTE: torch is pinned in the install step only (a CPU build, fast to install); the package
# itself accepts any recent torch.
TORCH_SPEC ?= torch==2.13.0

.PHONY: up test test-compose docker-images install system-deps proto proto-check proto-compat bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e ".[test]"
	touch $@

install: $(VENV)/.installed

up: install
	$(VENV)/bin/kvmesh up

# Debian's prometheus runs the dashboard-query test; installed when missing and apt-get is usable.
system-deps:
	@command -v prometheus >/dev/null 2>&1 || { \
	  if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null; \
	  else echo "note: prometheus not installed (needs root + apt-get); its test will be skipped"; fi; }

# NOTE: two test processes (pytest-xdist, whole files to one process): alone the suite kept ~1 of the
# 2 cores busy (15.5 min); `make test TEST_WORKERS=0` runs it in one process.
TEST_WORKERS ?= 2

test: install system-deps
	$(VENV)/bin/lint-imports
	$(PY) -m pytest -q $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

# compose.yaml under a real Docker engine (installs docker.io/docker-compose when missing, as root;
# builds a Debian base image when python:3.11-slim cannot be pulled); see deploy/docker/.
test-compose: install
	PY=$(PY) deploy/docker/test-compose.sh

docker-images:
	deploy/docker/images.sh

proto: install
	$(PY) -m kvmesh.runtime.protogen

proto-check: install
	$(PY) -m kvmesh.runtime.protogen --check

# buf lint + buf breaking against main (buf from tools/buf/package.json, via npm; also run by make test)
proto-compat: install
	$(PY) tools/proto_compat.py

bench: install
	$(PY) bench/engine.py
	$(PY) bench/mesh.py

clean:
	rm -rf $(VENV) build *.egg-info
