# One image for every kvmesh service: `docker run kvmesh:local kvmesh <command> ...`.
#
# Two stages on one base: `build` makes a virtualenv (the torch pin, then the project, like the
# Makefile but without the test extras); the runtime stage copies only that virtualenv, so it
# carries no pip, no compilers, no test packages and none of the build's pip settings.
#
# Build args (all optional; empty = pip's defaults):
#   BASE_IMAGE           any Debian-like image with python3 >= 3.11 and its venv module
#                        (`make docker-base` builds one from Debian packages where no registry answers)
#   TORCH_SPEC           the torch pin (the Makefile's)
#   TORCH_INDEX_URL      where torch comes from: the CPU wheel index, a CUDA one (e.g.
#                        https://download.pytorch.org/whl/cu128, compose.gpu.yaml), or empty:
#                        then the pip index / find-links below
#   PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, PIP_TRUSTED_HOST, PIP_FIND_LINKS
#                        a mirror or an offline index for everything else
# Files for pip go in deploy/pip/ (the only files of it the build context sends):
#   deploy/pip/ca.crt    a CA bundle pip trusts (a TLS-intercepting proxy, a private mirror)
#   deploy/pip/wheels/   a find-links folder (e.g. a torch wheel to install offline)
# They reach the build stage only. See README.md, "Docker Compose".
ARG BASE_IMAGE=python:3.11-slim

# The project's runtime dependencies as a requirements file: a layer that changes only with them.
FROM ${BASE_IMAGE} AS requirements
COPY pyproject.toml /tmp/
RUN python3 -c "import tomllib; print(*tomllib.load(open('/tmp/pyproject.toml', 'rb'))['project']['dependencies'], sep='\n')" \
    > /tmp/requirements.txt


FROM ${BASE_IMAGE} AS build

ARG TORCH_SPEC=torch==2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG PIP_INDEX_URL=""
ARG PIP_EXTRA_INDEX_URL=""
ARG PIP_TRUSTED_HOST=""
ARG PIP_FIND_LINKS=""

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    VIRTUAL_ENV=/opt/kvmesh/venv \
    PATH=/opt/kvmesh/venv/bin:$PATH

COPY deploy/pip/ /tmp/pip/
RUN python3 -m venv "$VIRTUAL_ENV"
# NOTE: empty build args are unset here so that pip keeps its own defaults.
RUN . /tmp/pip/env.sh && python -m pip install --upgrade pip
RUN . /tmp/pip/env.sh && python -m pip install "${TORCH_SPEC}" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}

# NOTE: the dependencies first, in their own layer, so a code change reinstalls only the project.
# NOTE: xgrammar (structured outputs) requires triton on x86-64 Linux, for GPU kernels a CPU torch
# never runs: a 1 GB install (and a large download). So xgrammar goes in without its dependencies,
# then those but triton. A CUDA torch requires triton itself and brings it.
COPY --from=requirements /tmp/requirements.txt /tmp/
RUN . /tmp/pip/env.sh && grep -v '^xgrammar' /tmp/requirements.txt > /tmp/others.txt \
    && python -m pip install -r /tmp/others.txt \
    && python -m pip install --no-deps "$(grep '^xgrammar' /tmp/requirements.txt)" \
    && python -c "import importlib.metadata as m; print(*(r for r in m.requires('xgrammar') \
         if 'extra ==' not in r and not r.startswith('triton')), sep='\n')" > /tmp/xgrammar.txt \
    && python -m pip install -r /tmp/xgrammar.txt

WORKDIR /tmp/kvmesh
COPY pyproject.toml README.md ./
COPY proto ./proto
COPY services ./services
RUN . /tmp/pip/env.sh && python -m pip install --no-deps .
# NOTE: the bytecode of transformers (xgrammar's dependency), sympy, networkx and mpmath that no
# kvmesh import loads: about 120 MB (see the script).
COPY deploy/docker/slim_bytecode.py /tmp/
RUN python /tmp/slim_bytecode.py "$VIRTUAL_ENV/lib/python3.11/site-packages"
# What serving never runs: torch's C++ headers, test binaries and protoc; pip itself. (The
# bytecode pip compiled stays: the runtime user cannot write it, and every start would recompile.)
RUN site="$VIRTUAL_ENV/lib/python3.11/site-packages" \
    && rm -rf "$site/torch/include" "$site/torch/test" \
    && find "$site/torch/bin" -type f ! -name torch_shm_manager -delete \
    && python -m pip uninstall --yes --quiet pip setuptools wheel


FROM ${BASE_IMAGE}

ENV PYTHONUNBUFFERED=1 \
    VIRTUAL_ENV=/opt/kvmesh/venv \
    PATH=/opt/kvmesh/venv/bin:$PATH \
    KVMESH_TRACE_DIR=/tmp/kvmesh/traces

COPY --from=build /opt/kvmesh/venv /opt/kvmesh/venv

RUN useradd --create-home --uid 10001 kvmesh \
    && mkdir -p /var/lib/kvmesh/kvstore \
    && chown -R kvmesh:kvmesh /var/lib/kvmesh
USER kvmesh
WORKDIR /home/kvmesh

# NOTE: the built-in tiny model is written once here, not by every container at start.
RUN python -c "from kvmesh.engine.tiny import ensure_tiny_model; print(ensure_tiny_model())"

EXPOSE 8000 8091 9101 9111 9121 9131 50051 50061 50071 50081 50091
CMD ["kvmesh", "--help"]
