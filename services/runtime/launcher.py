"""The plan of a local mesh: which processes `kvmesh up` starts, with which flags and env.

Pure: `plan_mesh(options, ports)` returns ProcessSpecs; `supervisor.py` runs them.
"""

from __future__ import annotations

import os
import random
import socket
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from .process import format_cpu_list

SERVICES = ("gateway", "scheduler", "prefill", "decode", "kvstore", "canary")


@dataclass(frozen=True, slots=True)
class ProcessSpec:
    name: str                          # unique, e.g. "decode-0"
    service: str                       # "decode"
    args: tuple[str, ...]              # after `kvmesh <service>`
    env: dict[str, str]
    grpc_endpoint: str = ""            # health-checked when set
    http_health: str = ""              # URL health-checked when set
    metrics_target: str = ""           # host:port serving /metrics
    pool: str = ""


@dataclass(slots=True)
class MeshOptions:
    model: str = "tiny"
    host: str = "127.0.0.1"
    port: int = 8000
    prefill: int = 1
    decode: int = 1
    kvstore: bool = True
    kvstores: int = 1                                            # KV store shards (rendezvous hashing)
    schedulers: int = 1                                          # active-active scheduler replicas
    nats: int = 1                                                # nats-server nodes (a cluster when > 1)
    canary: bool = False
    candidate_prefill: int = 0
    candidate_decode: int = 0
    candidate_model: str = ""
    candidate_cpu_priority: str = "idle"                         # candidate workers and the canary
    policy: str = ""
    run_dir: str = ".kvmesh"
    nats_port: int = 0
    cpus: int = 0                                                # 0 = os.cpu_count()
    pin_engines: bool = False                                    # engines on CPUs of their own (cpu_layout)
    settings: list[str] = field(default_factory=list)            # "service.field=value"
    candidate_settings: list[str] = field(default_factory=list)  # same, candidate workers only
    env: dict[str, str] = field(default_factory=dict)            # mesh-wide extra env
    external: list[str] = field(default_factory=list)            # "role=host:port": run by someone else


PORT_FLOOR = 20000  # free ports are drawn from here up to the kernel's ephemeral range
PORT_HOLD_S = 600.0  # how long a port `free_port` gave out is kept from every other caller on the host


def port_registry() -> str:
    """The directory where `free_port` notes the ports it gave out (one per user; `KVMESH_PORT_REGISTRY` overrides)."""
    return os.environ.get("KVMESH_PORT_REGISTRY") or os.path.join(tempfile.gettempdir(), f"kvmesh-ports-{os.getuid()}")


def _claim(port: int, registry: str, now: float) -> bool:
    """Notes `port` as given out (an empty file created exclusively); False when another process
    on the host got it within PORT_HOLD_S. True also when there is no usable registry: then a
    port is only as safe as the random draw makes it."""
    path = os.path.join(registry, str(port))
    for _ in range(2):
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
            return True
        except FileExistsError:
            try:
                if now - os.stat(path).st_mtime < PORT_HOLD_S:
                    return False
                os.unlink(path)  # NOTE: a stale note; if two callers race here, only one O_EXCL wins
            except FileNotFoundError:
                pass
        except OSError:
            return True
    return False


def ephemeral_low(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> int:
    """The lowest port the kernel gives outgoing connections (Linux; 32768 elsewhere or unreadable)."""
    try:
        with open(path, encoding="ascii") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing is bound to now, drawn at random below the kernel's ephemeral range.

    NOTE: not the kernel's own pick (bind to port 0): that comes from the ephemeral range, which every
    outgoing connection's local port comes from too, so in the seconds before a service bound it
    another process's gRPC client could take it (a CI run lost a candidate worker's metrics port,
    EADDRINUSE). Below the range only a listener can take it.

    NOTE: a port is also noted in `port_registry()` and not given to any other caller on the host
    for PORT_HOLD_S: a random draw alone let two meshes starting at once (pytest-xdist workers) pick
    the same port before either bound it (a fresh `make test` failed so: a prefill worker's metrics
    port, EADDRINUSE)."""
    high = ephemeral_low()
    low = PORT_FLOOR if high - PORT_FLOOR >= 1000 else 1024
    registry = port_registry()
    try:
        os.makedirs(registry, exist_ok=True)
    except OSError:
        pass  # _claim then claims nothing: the draw alone, as before
    for _ in range(200):
        port = random.randrange(low, high)
        if not _claim(port, registry, time.time()):
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:  # a crowded range: the kernel's pick
        sock.bind((host, 0))
        return sock.getsockname()[1]


def worker_threads(cpus: int, num_workers: int) -> int:
    """torch threads per worker when `num_workers` share `cpus` cores.

    NOTE: one core is left to the gateway, scheduler and gRPC threads. Workers that each took a
    thread per core (torch's default) thrashed: an OpenMP team waiting on a descheduled thread
    made a step ~100x slower on a busy 2-core machine (measured with bench/mesh.py).
    """
    return max(1, (cpus - 1) // max(1, num_workers))


def mesh_worker_threads(opts: MeshOptions) -> int:
    """The torch threads each worker of the mesh `opts` describes gets (and, pinned, its engine's CPUs)."""
    workers = opts.prefill + opts.decode + opts.candidate_prefill + opts.candidate_decode
    return worker_threads(opts.cpus or os.cpu_count() or 1, workers)


@dataclass(frozen=True, slots=True)
class CpuLayout:
    """`kvmesh up --pin-engines`: the CPU list of every process but the engines (`KVMESH_CPUS`), and
    each production worker's engine's own (its `engine_cpus`), in start order; "" = unpinned."""

    shared: str = ""
    engines: tuple[str, ...] = ()


def cpu_layout(allowed: Iterable[int], engines: int, threads: int) -> CpuLayout:
    """Each of `engines` engines gets `threads` CPUs of its own, from the highest down, and every
    other process shares what is left. Why: an engine that time-shares its CPU pays for every
    switch (its caches and predictors refilled): on a 2-core host the in-process engine took 1.6x
    its CPU per token beside a busy loop on its CPU and 1.0x beside one on the other
    (`bench/cpushare.sh`), and the mesh's own engine process took 1.1-1.2x the in-process engine's
    pinned against 1.2-1.5x unpinned (`bench/tokcost.py --pin-engines`, README).
    ValueError when nothing would be left for the rest of the mesh."""
    cpus = sorted(allowed)
    need = engines * threads
    if engines < 1:
        return CpuLayout()
    if len(cpus) - need < 1:
        raise ValueError(f"--pin-engines: {engines} engine(s) x {threads} thread(s) leave none of the {len(cpus)} "
                         "CPUs for the gateway, scheduler, KV store and NATS")
    own = [cpus[len(cpus) - (i + 1) * threads : len(cpus) - i * threads] for i in range(engines)]
    return CpuLayout(format_cpu_list(cpus[: len(cpus) - need]), tuple(format_cpu_list(c) for c in own))


def mesh_cpu_layout(opts: MeshOptions) -> CpuLayout:
    """The CPU layout of the mesh `opts` describes (unpinned without `pin_engines`)."""
    if not opts.pin_engines:
        return CpuLayout()
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    return cpu_layout(allowed[: opts.cpus or None], opts.prefill + opts.decode, mesh_worker_threads(opts))


def setting_env(assignments: list[str]) -> dict[str, dict[str, str]]:
    """["decode.kv_encoding=int8"] → {"decode": {"KVMESH_DECODE_KV_ENCODING": "int8"}}."""
    out: dict[str, dict[str, str]] = {}
    for item in assignments:
        key, sep, value = item.partition("=")
        service, dot, name = key.partition(".")
        if not sep or not dot or service not in SERVICES or not name:
            raise ValueError(f"bad --set {item!r}: expected SERVICE.field=value with SERVICE in {', '.join(SERVICES)}")
        out.setdefault(service, {})[f"KVMESH_{service.upper()}_{name.upper()}"] = value
    return out


def parse_external(items: list[str]) -> dict[str, list[str]]:
    """["decode=10.0.0.5:50099"] → {"decode": ["10.0.0.5:50099"]}: roles another process plays.

    Workers named here join the mesh beside the ones `kvmesh up` starts; a kvstore, scheduler,
    gateway or canary named here is not started (the mesh uses the one at that endpoint)."""
    out: dict[str, list[str]] = {}
    for item in items:
        role, sep, endpoint = item.partition("=")
        host, colon, port = endpoint.rpartition(":")
        if not sep or role not in SERVICES or not colon or not host or not port.isdigit():
            raise ValueError(f"bad --external {item!r}: expected ROLE=HOST:PORT with ROLE in {', '.join(SERVICES)}")
        if role not in ("prefill", "decode") and role in out:
            raise ValueError(f"--external names more than one {role}")
        out.setdefault(role, []).append(endpoint)
    return out


def distinct_ports(port_of: Callable[[], int], taken: Iterable[int] = ()) -> Callable[[], int]:
    """`port_of`, but never a port it already gave (or one in `taken`): a free port is only free
    until someone binds it, and the OS may offer a just-released one again."""
    used = set(taken)

    def next_port() -> int:
        for _ in range(100):
            port = port_of()
            if port not in used:
                used.add(port)
                return port
        raise OSError("no distinct free port found in 100 tries")

    return next_port


def plan_mesh(
    opts: MeshOptions, nats_url: Callable[[str], str], port_of: Callable[[], int] = free_port,
    taken: Iterable[int] = (),
) -> list[ProcessSpec]:
    """Processes in start order: kvstore shard(s), scheduler replica(s), prefill/decode workers,
    canary, gateway. `nats_url(service)` is the URL list (with that service's credentials) each
    service connects to; ports come from `port_of`, each once, none of `taken` or the gateway's.
    With several KV store shards, workers find them from their NATS announcements (`--kvstore
    nats`); with several schedulers, the gateway gets all their endpoints."""
    if opts.kvstores < 1 or opts.schedulers < 1 or opts.nats < 1:
        raise ValueError("--kvstores, --schedulers and --nats must be >= 1")
    port_of = distinct_ports(port_of, [*taken, opts.port])
    external = parse_external(opts.external)
    overrides = setting_env(opts.settings)
    candidate_overrides = setting_env(opts.candidate_settings)
    base_env = {
        "KVMESH_MODEL": opts.model,
        "KVMESH_TRACE_DIR": f"{opts.run_dir}/traces",
        **opts.env,
    }
    host = opts.host
    specs: list[ProcessSpec] = []

    threads = mesh_worker_threads(opts)
    layout = mesh_cpu_layout(opts)
    if layout.shared:
        base_env["KVMESH_CPUS"] = layout.shared
    engine_cpus = iter(layout.engines)

    def add(name: str, service: str, args: list[str], *, grpc_port: int = 0, metrics_port: int = 0,
            http_health: str = "", pool: str = "", env: dict[str, str] | None = None) -> None:
        defaults = {f"KVMESH_{service.upper()}_TORCH_THREADS": str(threads)} if service in ("prefill", "decode") else {}
        if pool == "production" and (own := next(engine_cpus, "")):
            defaults[f"KVMESH_{service.upper()}_ENGINE_CPUS"] = own
        merged = {**base_env, **defaults, "KVMESH_NATS_URL": nats_url(service), **overrides.get(service, {}),
                  **(env or {})}
        specs.append(ProcessSpec(
            name, service, tuple(args), merged,
            grpc_endpoint=f"{host}:{grpc_port}" if grpc_port else "",
            http_health=http_health,
            metrics_target=f"{host}:{metrics_port}" if metrics_port else "",
            pool=pool,
        ))

    kvstore_endpoint = external["kvstore"][0] if "kvstore" in external else ""
    for i in range(opts.kvstores if opts.kvstore and not kvstore_endpoint else 0):
        port, mport = port_of(), port_of()
        kvstore_endpoint = f"{host}:{port}" if opts.kvstores == 1 else "nats"
        add("kvstore" if opts.kvstores == 1 else f"kvstore-{i}", "kvstore",
            ["--host", host, "--port", str(port), "--metrics-port", str(mport), "--store-id", f"kvstore-{i}"],
            grpc_port=port, metrics_port=mport)
    schedulers = list(external["scheduler"]) if "scheduler" in external else []
    for i in range(0 if schedulers else opts.schedulers):
        sched_port, sched_mport = port_of(), port_of()
        schedulers.append(f"{host}:{sched_port}")
        sched_args = ["--host", host, "--port", str(sched_port), "--metrics-port", str(sched_mport),
                      "--replica-id", f"scheduler-{i}"]
        if opts.policy:
            sched_args += ["--policy", opts.policy]
        add("scheduler" if opts.schedulers == 1 else f"scheduler-{i}", "scheduler", sched_args,
            grpc_port=sched_port, metrics_port=sched_mport)
    scheduler = ",".join(schedulers)

    def workers(role: str, count: int, pool: str) -> None:
        env = {}
        if pool == "candidate":
            env = {"KVMESH_CPU_PRIORITY": opts.candidate_cpu_priority, **candidate_overrides.get(role, {})}
            if opts.candidate_model:
                env["KVMESH_MODEL"] = opts.candidate_model
        for i in range(count):
            port, mport = port_of(), port_of()
            worker_id = f"{role}-{i}" if pool == "production" else f"{role}-{pool}-{i}"
            args = ["--host", host, "--port", str(port), "--metrics-port", str(mport),
                    "--worker-id", worker_id, "--pool", pool]
            if kvstore_endpoint:
                args += ["--kvstore", kvstore_endpoint]
            add(worker_id, role, args, grpc_port=port, metrics_port=mport, pool=pool, env=env)

    workers("prefill", opts.prefill, "production")
    workers("decode", opts.decode, "production")
    workers("prefill", opts.candidate_prefill, "candidate")
    workers("decode", opts.candidate_decode, "candidate")
    if opts.canary and "canary" not in external:
        port, http_port = port_of(), port_of()
        # NOTE: the canary's SetProductionPool goes to one replica; replicas pass the split on (docs/replicas.md).
        add("canary", "canary", ["--host", host, "--port", str(port), "--http-port", str(http_port),
                                 "--scheduler", schedulers[0]],
            grpc_port=port, metrics_port=http_port, http_health=f"http://{host}:{http_port}/health",
            env={"KVMESH_CPU_PRIORITY": opts.candidate_cpu_priority,
                 "KVMESH_CANARY_CANDIDATE_CPU_PRIORITY": opts.candidate_cpu_priority,
                 "KVMESH_CANARY_STATE_FILE": f"{opts.run_dir}/canary-rollout.json"})
    if "gateway" not in external:
        add("gateway", "gateway", ["--host", host, "--port", str(opts.port), "--scheduler", scheduler],
            http_health=f"http://{host}:{opts.port}/health", metrics_port=opts.port)
    return specs
