"""The `kvmesh` command: `kvmesh up`, one subcommand per service, and tools."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence

SERVICE_COMMANDS = ("gateway", "scheduler", "prefill", "decode", "kvstore", "canary")
USAGE = """usage: kvmesh COMMAND [ARGS]

  up                run a whole mesh on this machine (NATS + every service), Ctrl-C stops it
  gateway|scheduler|prefill|decode|kvstore|canary
                    run one service (flags: `kvmesh SERVICE --help`)
  canary rollout start|status|abort
                    drive a running canary's automatic rollout (`kvmesh canary rollout --help`)
  health ENDPOINT   exit 0 when a gRPC host:port or an http(s) URL is healthy (for healthchecks)
  trace [ID]        list recent requests, or draw one request's trace waterfall
  sim               replay a trace against simulated workers with the real routing policies
  conform ROLE ENDPOINT
                    check a running implementation of a role against docs/contracts.md
  sim calibrate     measure a running mesh through its gateway: the cost flags for `kvmesh sim`
  sim replay TRACE  send a trace to a running mesh at its arrival times; the same table as `kvmesh sim`
"""


def up_main(argv: Sequence[str]) -> int:
    from .runtime.launcher import MeshOptions  # noqa: PLC0415 - keep `kvmesh --help` fast
    from .runtime.supervisor import Mesh  # noqa: PLC0415

    p = argparse.ArgumentParser(prog="kvmesh up", description="Run a whole mesh on this machine.")
    p.add_argument("--model", default="tiny", help="HF-format model directory, or 'tiny' (built in)")
    p.add_argument("--host", default="127.0.0.1", help="interface every service binds")
    p.add_argument("--port", type=int, default=8000, help="gateway HTTP port")
    p.add_argument("--prefill", type=int, default=1, help="prefill workers (0 = decode workers prefill)")
    p.add_argument("--decode", type=int, default=1, help="decode workers")
    p.add_argument("--no-kvstore", dest="kvstore", action="store_false", help="run without the KV cache store")
    p.add_argument("--kvstores", type=int, default=1,
                   help="KV store shards; blocks spread by rendezvous hashing, workers find shards on NATS")
    p.add_argument("--schedulers", type=int, default=1, help="active-active scheduler replicas (the gateway gets all)")
    p.add_argument("--nats", type=int, default=1, help="nats-server nodes; more than 1 runs a cluster on loopback")
    p.add_argument("--canary", action="store_true", help="also run the canary service")
    p.add_argument("--candidate-prefill", type=int, default=0, help="prefill workers in the 'candidate' pool")
    p.add_argument("--candidate-decode", type=int, default=0, help="decode workers in the 'candidate' pool")
    p.add_argument("--candidate-model", default="", help="model for the candidate pool (default: --model)")
    p.add_argument("--candidate-cpu-priority", default="idle", choices=["normal", "low", "idle"],
                   help="CPU priority of the candidate workers and the canary: idle (default) runs them only on "
                        "CPU time production leaves unused, low is nice 10")
    p.add_argument("--policy", default="", help="scheduler routing policy")
    p.add_argument("--pin-engines", action="store_true",
                   help="give each worker's engine CPUs of its own (its torch threads' worth, from the highest) and run "
                        "every other process on the rest, so none context-switches onto an engine's CPU (Linux)")
    p.add_argument("--run-dir", default=".kvmesh", help="logs, traces and mesh.json go here")
    p.add_argument("--set", dest="settings", action="append", default=[], metavar="SERVICE.FIELD=VALUE",
                   help="a service setting, e.g. --set decode.kv_encoding=int8 (repeatable)")
    p.add_argument("--candidate-set", dest="candidate_settings", action="append", default=[],
                   metavar="SERVICE.FIELD=VALUE", help="a setting for candidate-pool workers only")
    p.add_argument("--external", action="append", default=[], metavar="ROLE=HOST:PORT",
                   help="a role another process plays (repeatable): workers join beside the built-in ones "
                        "(--decode 0 --external decode=... swaps them); a kvstore/scheduler/gateway/canary is not started")
    args = p.parse_args(argv)
    opts = MeshOptions(**vars(args))
    try:
        mesh = Mesh(opts)
    except ValueError as exc:
        print(f"kvmesh: {exc}", file=sys.stderr)
        return 2
    for role, endpoints in mesh.external.items():
        for endpoint in endpoints:
            print(f"kvmesh: {role} at {endpoint} is external: start it with NATS {mesh.external_nats_url(role)}"
                  f"{'' if role == 'scheduler' else f' and scheduler {mesh.scheduler_endpoint}'}", flush=True)
    stop = False

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    print(f"kvmesh: starting NATS and {len(mesh.specs)} services (logs in {mesh.log_dir}/) ...", flush=True)
    try:
        mesh.start()
    except (RuntimeError, TimeoutError, OSError, ValueError) as exc:
        print(f"kvmesh: failed to start: {exc}", file=sys.stderr)
        return 1
    model = "tiny" if opts.model == "tiny" else opts.model.rstrip("/").split("/")[-1]
    print(f"kvmesh: ready at {mesh.gateway_url}  (Ctrl-C to stop)\n\n"
          f"  curl {mesh.gateway_url}/v1/chat/completions -H 'Content-Type: application/json' \\\n"
          f"    -d '{{\"model\": \"{model}\", \"messages\": [{{\"role\": \"user\", \"content\": \"Hello!\"}}], "
          f"\"max_tokens\": 32}}'\n", flush=True)
    for spec in mesh.specs:
        if spec.service == "canary":
            print(f"kvmesh: canary report at {spec.http_health.removesuffix('/health')}/report\n", flush=True)
    try:
        while not stop:
            for name, code in mesh.reap():
                print(f"kvmesh: {name} exited with {code} (see {mesh.log_dir}/{name}.log)", file=sys.stderr, flush=True)
            time.sleep(0.5)
    finally:
        print("kvmesh: stopping ...", flush=True)
        mesh.stop()
        print("kvmesh: stopped", flush=True)
    return 0


def health_main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="kvmesh health")
    p.add_argument("endpoint", help="gRPC host:port, or an http(s):// URL")
    p.add_argument("--timeout", type=float, default=2.0)
    args = p.parse_args(argv)
    if args.endpoint.startswith(("http://", "https://")):
        import urllib.request  # noqa: PLC0415

        try:
            with urllib.request.urlopen(args.endpoint, timeout=args.timeout) as reply:
                return 0 if reply.status == 200 else 1
        except OSError:
            return 1
    from .runtime.registry_client import grpc_healthy, mesh_tls  # noqa: PLC0415

    return 0 if grpc_healthy(args.endpoint, args.timeout, tls=mesh_tls()) else 1


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "up":
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
        return up_main(rest)
    if command == "exec-child":  # internal: `kvmesh up` runs nats-server through this
        from .runtime.process import apply_cpus  # noqa: PLC0415
        from .runtime.supervisor import die_with_parent  # noqa: PLC0415

        die_with_parent()
        apply_cpus(os.environ.get("KVMESH_CPUS", ""))  # NOTE: a pinning survives the exec
        os.execvp(rest[0], rest)
    if command == "health":
        return health_main(rest)
    if command == "trace":
        return importlib.import_module("kvmesh.runtime.tracecli").trace_main(rest)
    if command == "conform":
        return importlib.import_module("kvmesh.conform.runner").conform_main(rest)
    if command == "sim":
        return importlib.import_module("kvmesh.scheduler.sim").sim_main(rest)
    if command in SERVICE_COMMANDS:
        from .runtime.supervisor import die_with_parent  # noqa: PLC0415

        die_with_parent()
        return importlib.import_module(f"kvmesh.{command}.main").main(rest)
    print(f"kvmesh: unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
    return 2
