# One image for every kvmesh service: `docker run kvmesh:local kvmesh <command> ...`.
# The install steps are the README's / Makefile's (a torch pin, then the project with its extras);
# torch comes from the CPU wheel index unless TORCH_INDEX_URL names a CUDA one (compose.gpu.yaml).
FROM python:3.11-slim

ARG TORCH_SPEC=torch==2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    KVMESH_TRACE_DIR=/tmp/kvmesh/traces

WORKDIR /opt/kvmesh

RUN python -m pip install --upgrade pip
RUN python -m pip install "${TORCH_SPEC}" --index-url "${TORCH_INDEX_URL}"

COPY pyproject.toml README.md ./
COPY proto ./proto
COPY services ./services
RUN python -m pip install ".[test]"

RUN useradd --create-home --uid 10001 kvmesh \
    && mkdir -p /var/lib/kvmesh/kvstore \
    && chown -R kvmesh:kvmesh /var/lib/kvmesh
USER kvmesh
WORKDIR /home/kvmesh

# NOTE: the built-in tiny model is written once here, not by every container at start.
RUN python -c "from kvmesh.engine.tiny import ensure_tiny_model; print(ensure_tiny_model())"

EXPOSE 8000 8091 9101 9111 9121 9131 50051 50061 50071 50081 50091
CMD ["kvmesh", "--help"]
