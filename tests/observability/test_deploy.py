"""compose.yaml, the Dockerfile, Prometheus and Grafana provisioning agree with the code — checked
without a Docker engine: files parse, commands/ports/env are the services' settings, every
dashboard is provisioned and queries only METRICS.md names."""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import subprocess
import tomllib

import pytest

from kvmesh.runtime.config import settings_from_argv

from . import deployfiles as df

SPEC = df.compose()
KVMESH = df.kvmesh_services(SPEC)
PROMETHEUS = df.load_yaml(df.ROOT / "deploy" / "prometheus.yml")


def settings_class(command: str) -> type:
    """The service's settings class; a missing module or class fails the test (no skip hides it)."""
    module = importlib.import_module(f"kvmesh.{command}.config")
    return getattr(module, df.SETTINGS_CLASSES[command])


@pytest.fixture
def settings_of(monkeypatch: pytest.MonkeyPatch):
    """Builds a compose service's settings exactly as its container would: its env + its flags."""

    def build(name: str):
        command, argv = KVMESH[name]
        cls = settings_class(command)
        for var in [v for v in os.environ if v.startswith("KVMESH_")]:
            monkeypatch.delenv(var)
        for var, value in df.environment(SPEC["services"][name]).items():
            monkeypatch.setenv(var, value)
        settings = settings_from_argv(cls, argv, f"kvmesh {command}")
        if hasattr(settings, "check"):
            settings.check()
        return settings

    return build


def metrics_port(settings) -> int:
    """Where a service serves /metrics: its metrics_port, else its HTTP port."""
    for field in ("metrics_port", "http_port"):
        if hasattr(settings, field):
            return getattr(settings, field)
    return settings.port


# -- compose ------------------------------------------------------------------------------------
def test_compose_runs_every_service_with_infrastructure() -> None:
    assert {"gateway", "scheduler", "prefill", "decode", "kvstore", "canary"} <= {c for c, _ in KVMESH.values()}
    assert {"nats", "otel-collector", "tempo", "prometheus", "grafana"} <= set(SPEC["services"])
    images = {SPEC["services"][name]["image"] for name in KVMESH}
    assert images == {"kvmesh:local"}, "one image for every kvmesh service"
    assert all(SPEC["services"][name]["build"]["context"] == "." for name in KVMESH)


@pytest.mark.parametrize("name", sorted(KVMESH))
def test_command_flags_and_env_are_settings_fields(name: str) -> None:
    command, argv = KVMESH[name]
    cls = settings_class(command)
    unknown_flags = set(df.flag_names(argv)) - set(cls.model_fields)
    assert not unknown_flags, f"{name}: flags {unknown_flags} are not fields of {cls.__name__}"
    env = df.environment(SPEC["services"][name])
    unknown_env = {v for v in env if v.startswith("KVMESH_")} - df.env_names(cls)
    assert not unknown_env, f"{name}: {cls.__name__} reads none of {unknown_env}"


@pytest.mark.parametrize("name", sorted(KVMESH))
def test_ports_healthcheck_and_scrape_target_match_settings(name: str, settings_of) -> None:
    settings = settings_of(name)
    service = SPEC["services"][name]
    assert settings.host == "0.0.0.0", f"{name} must bind all interfaces inside its container"
    health = service["healthcheck"]["test"]
    assert health[:5] == ["CMD", "timeout", "9", "kvmesh", "health"], "ended before compose's own timeout"
    assert float(health[2]) < float(service["healthcheck"]["timeout"].rstrip("s"))
    if health[5].startswith("http"):
        assert health[5] == f"http://127.0.0.1:{getattr(settings, 'http_port', settings.port)}/health"
    else:
        assert health[5] == f"127.0.0.1:{settings.port}"
    served = {settings.port, metrics_port(settings)}
    for mapping in service.get("ports", []):
        assert int(str(mapping).rsplit(":", 1)[-1]) in served, f"{name} publishes {mapping}, not one of its ports"
    [job] = [j for j in PROMETHEUS["scrape_configs"] if j["job_name"] == name]
    [sd] = job["dns_sd_configs"]
    assert (sd["names"], sd["port"]) == ([name], metrics_port(settings))


@pytest.mark.parametrize("name", sorted(KVMESH))
def test_endpoints_name_compose_services_at_their_ports(name: str, settings_of) -> None:
    settings = settings_of(name)
    for field, value in settings.model_dump().items():
        target = df.host_port(value) if isinstance(value, str) else None
        if not target or target[0] not in SPEC["services"]:
            continue
        host, port = target
        if host == "nats":
            assert port == 4222 and any(p.endswith(":4222:4222") for p in df.interpolate(SPEC["services"]["nats"]["ports"]))
        elif host == "otel-collector":
            collector = df.load_yaml(df.ROOT / "deploy" / "otel-collector.yaml")
            assert collector["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"].endswith(f":{port}")
        else:
            assert port == settings_of(host).port, f"{name}.{field}={value} is not where {host} listens"
        assert host in SPEC["services"][name]["depends_on"], f"{name} uses {host} but does not depend on it"


def test_decode_scales_and_workers_advertise_their_own_address() -> None:
    for name, (command, _argv) in KVMESH.items():
        service = SPEC["services"][name]
        if command in ("decode", "prefill"):
            assert "ports" not in service and "container_name" not in service, f"{name} must stay scalable"
            assert df.environment(service)[f"KVMESH_{command.upper()}_ADVERTISE_HOST"] == ""


def test_depends_on_waits_for_health_where_there_is_one() -> None:
    for name, service in SPEC["services"].items():
        for dep, cond in (service.get("depends_on") or {}).items():
            assert dep in SPEC["services"], f"{name} depends on unknown {dep}"
            if cond["condition"] == "service_healthy":
                assert "healthcheck" in SPEC["services"][dep], f"{name} waits for {dep}'s health, which has none"
            elif dep in KVMESH or dep == "nats":
                pytest.fail(f"{name} must wait for {dep} to be healthy")


def test_gpu_override_reserves_gpus_for_workers_only() -> None:
    gpu = df.compose("compose.gpu.yaml")
    assert set(gpu["services"]) <= set(SPEC["services"])
    for name, service in gpu["services"].items():
        assert KVMESH[name][0] in ("prefill", "decode")
        [device] = service["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
    assert not any("deploy" in SPEC["services"][name] for name in KVMESH), "compose.yaml itself stays CPU-only"


def test_prometheus_scrapes_every_kvmesh_service_and_remote_targets() -> None:
    jobs = {j["job_name"]: j for j in PROMETHEUS["scrape_configs"]}
    assert set(KVMESH) <= set(jobs)
    [files] = jobs["remote"]["file_sd_configs"]
    mounts = dict(m.split(":")[:2] for m in SPEC["services"]["prometheus"]["volumes"])
    assert files["files"] == [f"{mounts['./deploy/prometheus-targets']}/*.json"]
    assert (df.ROOT / "deploy" / "prometheus-targets").is_dir()


def test_worker_host_file_runs_the_same_workers_against_the_main_host(monkeypatch: pytest.MonkeyPatch) -> None:
    workers = df.compose("deploy/compose.workers.yaml")
    env = {"KVMESH_MAIN_HOST": "10.0.0.10", "KVMESH_ADVERTISE_HOST": "10.0.0.12"}
    with pytest.raises(KeyError, match="KVMESH_MAIN_HOST"):
        df.kvmesh_services(workers)
    services = df.kvmesh_services(workers, env)
    assert {c for c, _ in services.values()} == {"prefill", "decode"}
    nats_nodes = {n: published_port(n) for n in SPEC["services"] if n.startswith("nats")}  # host ports
    assert list(nats_nodes) == ["nats", "nats-1", "nats-2"] and len(set(nats_nodes.values())) == 3
    for name, (command, argv) in services.items():
        service = workers["services"][name]
        assert service["network_mode"] == "host" and service["build"]["context"] == ".."
        main_env = df.environment(SPEC["services"][command])
        for var in [v for v in os.environ if v.startswith("KVMESH_")]:
            monkeypatch.delenv(var)
        for var, value in df.environment(service, env).items():
            monkeypatch.setenv(var, value)
        settings = settings_from_argv(settings_class(command), argv, f"kvmesh {command}")
        assert settings.advertise_host == "10.0.0.12" and settings.kvstore == "10.0.0.10:50081"
        assert settings.nats_url == ",".join(f"nats://10.0.0.10:{p}" for p in nats_nodes.values()), "every NATS node"
        assert settings.otlp_endpoint == "http://10.0.0.10:4317"
        assert set(df.environment(service, env)) == set(main_env) - {f"KVMESH_{command.upper()}_ADVERTISE_HOST"}
        assert service["healthcheck"]["test"][5] == f"127.0.0.1:{settings.port}"
        main_argv = KVMESH[command][1]
        assert argv[: argv.index("--kvstore")] == main_argv[: main_argv.index("--kvstore")], "same ports as compose.yaml"
    published = {name: [str(p).rsplit(":", 1)[-1] for p in SPEC["services"][name].get("ports", [])]
                 for name in (*nats_nodes, "kvstore", "otel-collector")}
    assert published == {**{n: ["4222"] for n in nats_nodes}, "kvstore": ["50081"], "otel-collector": ["4317"]}


# -- Grafana provisioning and dashboards ----------------------------------------------------------
def test_every_dashboard_file_is_provisioned() -> None:
    grafana = SPEC["services"]["grafana"]
    mounts = dict(m.split(":")[:2] for m in grafana["volumes"])
    assert mounts["./dashboards/provisioning/datasources.yaml"].startswith("/etc/grafana/provisioning/datasources/")
    assert mounts["./dashboards/provisioning/dashboards.yaml"].startswith("/etc/grafana/provisioning/dashboards/")
    provider_paths = [p["options"]["path"] for p in df.load_yaml(df.DASHBOARDS / "provisioning" / "dashboards.yaml")["providers"]]
    assert provider_paths == [mounts["./dashboards"]]
    files = df.dashboard_files()
    assert {f.name for f in files} == {"overview.json", "kv-cache.json", "scheduler.json", "canary.json"}
    assert all(f.parent == df.DASHBOARDS for f in files), "the provider reads the dashboards folder"
    assert grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"] == f"{mounts['./dashboards']}/overview.json"


def test_dashboards_use_provisioned_datasources_and_unique_ids() -> None:
    sources = df.load_yaml(df.DASHBOARDS / "provisioning" / "datasources.yaml")["datasources"]
    uids = {s["uid"]: s for s in sources}
    assert uids["prometheus"]["type"] == "prometheus" and uids["tempo"]["type"] == "tempo"
    assert df.host_port(uids["prometheus"]["url"])[0] == "prometheus"
    assert df.host_port(uids["tempo"]["url"]) == ("tempo", df.load_yaml(df.ROOT / "deploy" / "tempo.yaml")["server"]["http_listen_port"])
    board_uids = []
    for path in df.dashboard_files():
        board = json.loads(path.read_text())
        board_uids.append(board["uid"])
        ids = [p["id"] for p in df.panels(board)]
        assert len(ids) == len(set(ids)), f"{path.name}: duplicate panel ids"
        for panel in df.panels(board):
            assert panel["datasource"]["uid"] in uids, f"{path.name}: {panel['title']}"
            assert panel["targets"], f"{path.name}: {panel['title']} has no query"
    assert len(board_uids) == len(set(board_uids))


def test_dashboard_queries_use_only_metrics_md_names() -> None:
    known = set(df.metrics_md()) | df.PROMETHEUS_BUILTINS
    for board, title, expr in df.prometheus_queries():
        unknown = df.metric_names(expr) - known
        assert not unknown, f"{board} / {title}: {unknown} not in dashboards/METRICS.md"
        assert "[1m]" in expr or "rate(" not in expr, f"{board} / {title}: use [1m] windows"


def test_histogram_and_counter_suffixes_follow_metric_types() -> None:
    types = df.metrics_md()
    for board, title, expr in df.prometheus_queries():
        for name in re.findall(r"\b(kvmesh_\w+?)_bucket\b", expr):
            assert types[name]["type"] == "histogram", f"{board} / {title}: {name} is not a histogram"
        for name in re.findall(r"rate\((kvmesh_\w+?)(?:\{[^}]*\})?\[", expr):
            assert name.endswith(("_total", "_bucket", "_sum", "_count")), f"{board} / {title}: rate() of gauge {name}"


# -- image ----------------------------------------------------------------------------------------
def test_dockerfile_installs_like_the_makefile_without_test_extras() -> None:
    make, docker = df.makefile_installs(), df.dockerfile_installs()
    torch = lambda installs: [r for reqs in installs for r in reqs if r.startswith("torch")]  # noqa: E731
    assert torch(docker) == torch(make) and all("==" in r for r in torch(docker)), "the Makefile's torch pin"
    assert [".[test]"] in make and ["."] in docker, "the image installs the project, without the test extras"
    assert not any("[" in r for reqs in docker for r in reqs)
    text = (df.ROOT / "Dockerfile").read_text()
    requires = tomllib.loads((df.ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    base = re.search(r"^ARG BASE_IMAGE=python:(\d+\.\d+)-slim$", text, re.M).group(1)
    assert requires == f">={base}", "the image runs the oldest supported Python"
    stages = re.findall(r"^FROM (\S+)(?: AS (\w+))?$", text, re.M)
    assert stages[-2:] == [("${BASE_IMAGE}", "build"), ("${BASE_IMAGE}", "")], "a build stage, then the runtime on its base"
    assert all(base == "${BASE_IMAGE}" for base, _ in stages)
    runtime = text[text.rindex("\nFROM "):]
    assert "pip install" not in runtime and "apt-get" not in runtime, "the runtime stage installs nothing"
    assert re.findall(r"^COPY --from=build (\S+)", runtime, re.M) == ["/opt/kvmesh/venv"], "only the virtualenv"


def test_dockerignore_keeps_what_the_image_copies() -> None:
    ignore = (df.ROOT / ".dockerignore").read_text().splitlines()
    copied = re.findall(r"^COPY\s+(?!--from)(.+?)\s+\S+$", (df.ROOT / "Dockerfile").read_text(), re.M)
    for sources in copied:
        for source in sources.split():
            assert f"!{source.rstrip('/')}" in [line.rstrip("/") for line in ignore], f".dockerignore drops {source}"
            assert (df.ROOT / source).exists(), f"the Dockerfile copies missing {source}"


def test_compose_files_suit_docker_compose_1_29() -> None:
    for name in ("compose.yaml", "compose.gpu.yaml", "compose.test.yaml", "deploy/compose.workers.yaml"):
        spec = df.compose(name)
        assert "name" not in spec and "version" not in spec, f"{name}: docker-compose 1.29 rejects a top-level name"


def published_port(service: str) -> int:
    """The host port compose.yaml publishes `service`'s one port on by default."""
    [mapping] = SPEC["services"][service]["ports"]
    return int(df.interpolate(mapping).split(":")[1])


def test_every_port_is_published_on_the_publish_host() -> None:
    """Each on KVMESH_PUBLISH_HOST, on a host port of its own: the container's, but for the
    second and third NATS nodes (4223, 4224: all three listen on 4222)."""
    host_ports = []
    for name, service in SPEC["services"].items():
        for mapping in service.get("ports", []):
            port = mapping.rsplit(":", 1)[-1]
            host_port = {"nats-1": "4223", "nats-2": "4224"}.get(name, port)
            assert df.interpolate(mapping) == f"127.0.0.1:{host_port}:{port}", f"{name}: {mapping}"
            free = df.interpolate(mapping, {"KVMESH_PUBLISH_HOST": "0.0.0.0"})
            assert free == f"0.0.0.0:{host_port}:{port}", f"{name}: {mapping} must follow KVMESH_PUBLISH_HOST"
            host_ports.append(host_port)
    assert len(host_ports) == len(set(host_ports)), host_ports


def test_test_override_replaces_only_what_cannot_be_pulled() -> None:
    test = df.compose("compose.test.yaml")["services"]
    assert set(test) <= set(SPEC["services"])
    pulled = {name for name, s in SPEC["services"].items() if "build" not in s}
    assert pulled == {"nats", "nats-1", "nats-2", "otel-collector", "tempo", "prometheus", "grafana"}
    for name in pulled - {"grafana"}:
        assert test[name]["image"] in ("kvmesh:local", "kvmesh-prometheus:local"), f"{name} needs a local image"
    assert test["grafana"]["profiles"]
    for node in ("nats", "nats-1", "nats-2"):  # the same cluster, from the image's own nats-server
        assert test[node]["command"][0] == "nats-server"
        assert test[node]["command"][1:] == ["--port", "4222", *SPEC["services"][node]["command"]]
    for name in KVMESH:
        assert test[name] == {"environment": {"KVMESH_OTLP_ENDPOINT": ""}}, f"{name}: only OTLP is turned off"


@pytest.mark.skipif(shutil.which("promtool") is None, reason="no `promtool` (Debian's prometheus package) on PATH")
def test_prometheus_config_passes_promtool() -> None:
    checked = subprocess.run(["promtool", "check", "config", str(df.ROOT / "deploy" / "prometheus.yml")],
                             capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
