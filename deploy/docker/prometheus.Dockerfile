# Prometheus from Debian's package, for compose.test.yaml where prom/prometheus cannot be pulled.
# Same entry point as prom/prometheus: config at /etc/prometheus/prometheus.yml, data at /prometheus.
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}
USER root
# NOTE: policy-rc.d keeps the package's postinst from starting a daemon inside the build.
RUN printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d \
    && apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus wget \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /prometheus && chown prometheus:prometheus /prometheus
USER prometheus
EXPOSE 9090
ENTRYPOINT ["/usr/bin/prometheus", "--config.file=/etc/prometheus/prometheus.yml", \
            "--storage.tsdb.path=/prometheus", "--web.listen-address=:9090"]
