"""Readers for the deployment files the observability tests check (compose, Prometheus,
Grafana provisioning, dashboards, METRICS.md, Dockerfile, Makefile). No Docker needed."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import yaml

from kvmesh.runtime.settingsdoc import SERVICES

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = ROOT / "dashboards"
SETTINGS_CLASSES = SERVICES  # service → its settings class name
# Series Prometheus makes itself; dashboards may use them besides METRICS.md's names.
PROMETHEUS_BUILTINS = frozenset({"up", "scrape_duration_seconds", "scrape_samples_scraped"})
_VAR = re.compile(r"\$\{(\w+)(?::?([-?])([^}]*))?\}")
_METRIC = re.compile(r"\b(kvmesh_[a-z0-9_]+|up|scrape_duration_seconds|scrape_samples_scraped)\b(?!\s*\()")


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def interpolate(value: Any, env: dict[str, str] | None = None) -> Any:
    """Compose's `${VAR}`, `${VAR:-default}` and `${VAR:?error}` against `env` (default: nothing set)."""
    env = env or {}

    def one(m: re.Match) -> str:
        if env.get(m.group(1)):
            return env[m.group(1)]
        if m.group(2) == "?":
            raise KeyError(f"compose needs {m.group(1)}: {m.group(3)}")
        return m.group(3) or ""

    if isinstance(value, str):
        return _VAR.sub(one, value)
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    return value


def compose(name: str = "compose.yaml") -> dict[str, Any]:
    return load_yaml(ROOT / name)


def kvmesh_services(spec: dict[str, Any], env: dict[str, str] | None = None) -> dict[str, tuple[str, list[str]]]:
    """compose service → (kvmesh command, its flags) for every service running `kvmesh <command>`."""
    out = {}
    for name, service in spec["services"].items():
        command = interpolate(service.get("command") or [], env)
        if isinstance(command, str):
            command = shlex.split(command)
        if command[:1] == ["kvmesh"] and len(command) > 1:
            out[name] = (command[1], command[2:])
    return out


def environment(service: dict[str, Any], env: dict[str, str] | None = None) -> dict[str, str]:
    values = service.get("environment") or {}
    if isinstance(values, list):
        values = dict(item.partition("=")[::2] for item in values)
    return {k: "" if v is None else str(v) for k, v in interpolate(values, env).items()}


def env_names(settings_cls: type) -> set[str]:
    """Every environment variable a pydantic-settings class reads."""
    prefix = settings_cls.model_config.get("env_prefix", "")
    names = set()
    for name, field in settings_cls.model_fields.items():
        alias = field.validation_alias
        choices = getattr(alias, "choices", None) or ([alias] if isinstance(alias, str) else [])
        strings = [c for c in choices if isinstance(c, str)]
        names.update(c.upper() for c in strings) if strings else names.add(f"{prefix}{name}".upper())
    return names


def flag_names(argv: list[str]) -> list[str]:
    return [a[2:].split("=", 1)[0].replace("-", "_") for a in argv if a.startswith("--")]


def host_port(value: str) -> tuple[str, int] | None:
    match = re.fullmatch(r"(?:[a-z]+://)?([\w.-]+):(\d+)(/.*)?", value)
    return (match.group(1), int(match.group(2))) if match else None


# -- dashboards ---------------------------------------------------------------------------------
def dashboard_files() -> list[Path]:
    return sorted(DASHBOARDS.rglob("*.json"))


def panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    found = []
    for panel in board.get("panels", []):
        found.append(panel)
        found += panel.get("panels", [])  # collapsed rows keep their panels inside
    return [p for p in found if p.get("type") != "row"]


def prometheus_queries() -> list[tuple[str, str, str]]:
    """(dashboard file, panel title, PromQL) for every Prometheus target of every panel."""
    out = []
    for path in dashboard_files():
        board = json.loads(path.read_text())
        for panel in panels(board):
            for target in panel.get("targets", []):
                uid = (target.get("datasource") or panel.get("datasource") or {}).get("uid")
                if uid == "prometheus":
                    out.append((path.name, panel["title"], target["expr"]))
    return out


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression, histogram series folded back to their METRICS.md name."""
    names = set()
    for name in _METRIC.findall(expr):
        for suffix in ("_bucket", "_sum", "_count"):
            if name.endswith(suffix) and name.startswith("kvmesh_"):
                name = name[: -len(suffix)]
                break
        names.add(name)
    return names


def metrics_md() -> dict[str, dict[str, Any]]:
    """METRICS.md's names → {"type", "labels", "service"} (rows like `a` / `b` give each name)."""
    out = {}
    service = ""
    for line in (DASHBOARDS / "METRICS.md").read_text().splitlines():
        if line.startswith("## "):
            service = line[3:].split()[0]
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`kvmesh_"):
            continue
        labels = re.findall(r"`(\w+)`", cells[2])
        for name in re.findall(r"`(kvmesh_\w+)`", cells[0]):
            out[name] = {"type": cells[1], "labels": labels, "service": service}
    return out


# -- install steps ------------------------------------------------------------------------------
def pip_installs(lines: list[str], variables: dict[str, str]) -> list[list[str]]:
    """The requirement arguments of each `pip install` line, variables resolved, flags dropped."""
    installs = []
    for line in lines:
        if "pip install" not in line:
            continue
        for name, value in variables.items():
            line = line.replace(f"$({name})", value).replace(f"${{{name}}}", value).replace(f"${name}", value)
        words = shlex.split(line.split("pip install", 1)[1].split("&&")[0])
        reqs, skip = [], False
        for word in words:
            if skip:
                skip = False
            elif word in ("--index-url", "--extra-index-url", "-i", "-c", "-r", "--find-links", "-f"):
                skip = True
            elif not word.startswith("-") and "${" not in word:  # shell expansions are options
                reqs.append(word)
        installs.append(reqs)
    return installs


def makefile_installs() -> list[list[str]]:
    text = (ROOT / "Makefile").read_text()
    variables = dict(re.findall(r"^(\w+)\s*\??=\s*(.+?)\s*$", text, re.M))
    return pip_installs(text.splitlines(), variables)


def dockerfile_installs() -> list[list[str]]:
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    variables = dict(re.findall(r"^ARG\s+(\w+)=(\S+)", text, re.M))
    return pip_installs([ln for ln in text.splitlines() if ln.startswith("RUN")], variables)
