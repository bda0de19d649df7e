"""`kvmesh canary rollout start|status|abort`: drives a running canary's /rollout over REST."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

FINISHED = ("completed", "rolled_back", "aborted")


def _call(method: str, url: str, admin_key: str, body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    if admin_key:
        request.add_header("Authorization", f"Bearer {admin_key}")
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, json.loads(reply.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def describe(status: dict[str, Any]) -> str:
    """One line for the rollout, then one per step with its verdict and the figures judged."""
    lines = [f"rollout {status['state']}" + (f" at step {status['step']}" if status.get("steps") else "")
             + (f": {status['reason']}" if status.get("reason") else "")]
    for i, step in enumerate(status.get("steps", ()), 1):
        lines.append(f"  {i}. {step['weight']:>6g}  {step['state']:<8} samples {step['samples']:>4}  "
                     f"served {step['served']:>4}  {step['reason']}")
        lines.extend(f"       {'n/c ' if not c['comparable'] else 'ok  ' if c['passed'] else 'FAIL'} {c['detail']}"
                     for c in step["checks"])
    return "\n".join(lines)


def rollout_main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="kvmesh canary rollout", description="Automatic rollout on a running canary.")
    p.add_argument("action", choices=["start", "status", "abort"])
    p.add_argument("--url", default=os.environ.get("KVMESH_CANARY_URL", "http://127.0.0.1:8091"),
                   help="the canary's REST address (env KVMESH_CANARY_URL)")
    p.add_argument("--admin-key", default=os.environ.get("KVMESH_CANARY_ADMIN_KEY", ""),
                   help="bearer key (env KVMESH_CANARY_ADMIN_KEY)")
    p.add_argument("--steps", default="0.01,0.05,0.25,0.5,1.0", help="comma-separated traffic shares, last 1.0")
    p.add_argument("--min-samples", type=int, default=None, help="compared replays per step (default: the canary's)")
    p.add_argument("--min-seconds", type=float, default=0.0, help="least time per step")
    p.add_argument("--min-served", type=int, default=0, help="production requests the candidate serves per step")
    p.add_argument("--judge-latency", action="store_true",
                   help="judge latency even when the candidate runs at reduced CPU priority")
    p.add_argument("--wait", action="store_true", help="follow the rollout until it finishes (exit 0 only if completed)")
    args = p.parse_args(argv)
    url = f"{args.url.rstrip('/')}/rollout"
    try:
        if args.action == "start":
            try:
                steps = [float(w) for w in args.steps.split(",")]
            except ValueError:
                p.error(f"--steps must be numbers separated by commas, got {args.steps!r}")
            body: dict[str, Any] = {"steps": steps, "min_seconds": args.min_seconds, "min_served": args.min_served,
                                    "judge_latency": args.judge_latency}
            if args.min_samples is not None:
                body["min_samples"] = args.min_samples
            code, status = _call("POST", url, args.admin_key, body)
        elif args.action == "abort":
            code, status = _call("DELETE", url, args.admin_key)
        else:
            code, status = _call("GET", url, args.admin_key)
        while code == 200 and args.wait and status["state"] not in FINISHED:
            time.sleep(1.0)
            code, status = _call("GET", url, args.admin_key)
    except (OSError, ValueError) as exc:
        print(f"kvmesh canary: cannot reach {url}: {exc}", file=sys.stderr)
        return 1
    if code != 200:
        print(f"kvmesh canary: {code}: {status.get('error', status)}", file=sys.stderr)
        return 1
    print(describe(status))
    return 0 if not args.wait or status["state"] == "completed" else 3
