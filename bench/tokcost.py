"""CPU time per output token in every mesh process, beside the in-process engine, in one run.

    nice -n 5 .venv/bin/python bench/tokcost.py [--model tiny|DIR] [--requests 128] [--max-tokens 128] [--concurrency 32,64]
        [--vary-tokens] [--rounds N]

Starts `kvmesh up --prefill 0 --decode 1` (gateway, scheduler, one decode worker, kvstore, NATS),
drives it with streamed chat requests from a client in its own process, and reads each mesh
process's CPU time (user + system, all threads, via psutil) before and after the load. Right after
each load (the mesh idles meanwhile) it runs the in-process engine (its own process too) on the
same prompt token ids and reads its CPU time the same way. Every load has prompts of its own, so
none finds its turns in the KV store already; `--rounds N` repeats each level's load and
reference N times and shows the median round. Prints CPU µs per output token per process (a worker's row includes its engine
process's CPU, setting `engine_process`) and the decode worker's engine thread's (or engine process's)
share, the mesh total over the engine's, and the throughput ratio. CPU time per token is much less sensitive to a loaded machine than wall
time; the throughput ratio is not, so compare it only within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

USER_TEXTS = ["Tell me a story about a lighthouse.", "What is a mesh?", "Count to ten, slowly.",
              "Write a haiku about GPUs.", "Explain KV caches to a child.", "Why is the sky blue?"]


def messages(i: int) -> list[dict]:
    return [{"role": "user", "content": f"{USER_TEXTS[i % len(USER_TEXTS)]} (#{i})"}]


# -- the client (its own process) -------------------------------------------------------------
def output_lengths(requests: int, max_tokens: int, vary: bool) -> list[int]:
    """Each request's output length: `max_tokens` for all, or with `vary` spread evenly over
    max_tokens/2 .. 3*max_tokens/2 (the same mean) in a fixed shuffled order, so a closed loop's
    requests stop finishing in waves (see --vary-tokens)."""
    if not vary or requests < 2:
        return [max_tokens] * requests
    lo, hi = max(1, max_tokens // 2), max(1, max_tokens * 3 // 2)
    stride = next((s for s in (7919, 104729) if requests % s), 1)  # a prime not dividing `requests`: i -> i*stride is a permutation
    return [lo + (i * stride % requests) * (hi - lo) // (requests - 1) for i in range(requests)]


def _bodies(model: str, requests: int, max_tokens: int, vary: bool = False, first: int = 0) -> list[dict]:
    """The load's request bodies; prompts `messages(first + i)` (a round's or level's own: see `prompt_offset`)."""
    return [{"model": model, "messages": messages(first + i), "max_tokens": n, "temperature": 0, "stream": True,
             "stream_options": {"include_usage": True}, "ignore_eos": True}
            for i, n in enumerate(output_lengths(requests, max_tokens, vary))]


async def _httpx_client(url: str, bodies: list[dict], concurrency: int) -> dict:
    import httpx

    sem = asyncio.Semaphore(concurrency)
    tokens = 0
    failures = 0
    chunks = 0  # SSE chunks with content (a slow reader's tokens coalesce, so it can be < tokens)

    async def one(client: httpx.AsyncClient, body: dict) -> None:
        nonlocal tokens, failures, chunks
        async with sem:
            async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as reply:
                usage = None
                async for line in reply.aiter_lines():
                    if line.startswith("data: {") and '"usage":{' in line:
                        usage = json.loads(line[6:])["usage"]
                    elif line.startswith('data: {') and '"content":"' in line:
                        chunks += 1
                if reply.status_code != 200 or usage is None:
                    failures += 1
                else:
                    tokens += usage["completion_tokens"]

    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        t0, cpu0 = time.perf_counter(), time.process_time()
        await asyncio.gather(*(one(client, body) for body in bodies))
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return {"tokens": tokens, "wall_s": wall, "failures": failures, "chunks": chunks, "requests": len(bodies),
            "client_cpu_s": cpu}


def client_child(kind: str, url: str, model: str, requests: int, concurrency: int, max_tokens: int,
                 vary: bool = False, first: int = 0, ready: Callable[[], None] = lambda: None) -> dict:
    """Runs the load; `ready()` is called once everything is imported and built, just before it."""
    from kvmesh.runtime.process import apply_cpus

    apply_cpus(os.environ.get("KVMESH_CPUS", ""))  # --pin-engines: off the engine's CPU, as the mesh's other processes
    bodies = _bodies(model, requests, max_tokens, vary, first)
    if kind == "httpx":
        import httpx  # noqa: F401 - imported before `ready`, not inside the load

        ready()
        return asyncio.run(_httpx_client(url, bodies, concurrency))
    import sseload

    ready()
    return sseload.main_sync(url, bodies, concurrency)


def _ready_then_wait() -> None:
    """The client child's side of run_client's handshake: says it is ready, waits for the go."""
    print("ready", flush=True)
    sys.stdin.readline()


def run_client(url: str, model: str, requests: int, concurrency: int, max_tokens: int, kind: str = "raw",
               cpus: str = "", vary: bool = False, first: int = 0, on_ready: Callable[[], None] = lambda: None) -> dict:
    """Runs the load in a child process; returns its result. `kind`: the load generator, "raw"
    (bench/sseload.py) or "httpx"; `cpus`: the CPUs it runs on ("" = any); `vary`: output_lengths;
    `first`: the first prompt's number. `on_ready()` runs once the child has started, imported and
    built its requests, and the load starts when it returns: the mesh's CPU read there leaves out
    the mesh idling through the client's start-up (~0.2 s of Python imports)."""
    argv = [sys.executable, __file__, "--client", url, "--served", model, "--requests", str(requests),
            "--concurrency", str(concurrency), "--max-tokens", str(max_tokens), "--client-kind", kind,
            "--first", str(first), *(["--vary-tokens"] if vary else [])]
    env = {**os.environ, "KVMESH_CPUS": cpus}
    with tempfile.TemporaryFile("w+") as err:
        child = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
        if child.stdout.readline().strip() == "ready":
            on_ready()
            child.stdin.write("go\n")
            child.stdin.flush()
        out, _ = child.communicate()
        err.seek(0)
        if child.returncode != 0:
            raise RuntimeError(f"the load client exited {child.returncode}:\n{err.read()[-3000:]}")
    return json.loads(out.strip().splitlines()[-1])


# -- the in-process engine (its own process) --------------------------------------------------
def engine_child(model: str, requests: int, concurrency: int, max_tokens: int, vary: bool = False,
                 first: int = 0) -> dict:
    import psutil
    import torch

    from kvmesh.engine.llm import EngineConfig, LLMEngine
    from kvmesh.engine.sampling import SamplingParams
    from kvmesh.engine.tiny import resolve_model
    from kvmesh.engine.tokenizer import Tokenizer
    from kvmesh.runtime.launcher import worker_threads

    torch.set_num_threads(worker_threads(os.cpu_count() or 1, 1))  # what a lone mesh worker gets
    tok = Tokenizer.from_dir(resolve_model(model))
    prompts = [_chat_ids(tok, messages(first + i)) for i in range(requests)]
    engine = LLMEngine(EngineConfig(model=model))
    engine.generate([prompts[0]], SamplingParams(temperature=0.0, max_tokens=4))  # warm up
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
              for n in output_lengths(requests, max_tokens, vary)]
    me = psutil.Process()
    ran, step_cpu = model_steps(engine), step_cpu_s(engine)
    cpu0, t0 = process_cpu_s(me), time.perf_counter()
    tokens, _ = closed_loop(engine, prompts, params, concurrency)
    return {"tokens": tokens, "wall_s": time.perf_counter() - t0, "cpu_s": process_cpu_s(me) - cpu0,
            "steps": model_steps(engine) - ran, "step_cpu_s": step_cpu_s(engine) - step_cpu}


def model_steps(engine) -> int:
    """Steps that ran the model (both kinds): what the mesh's decode workers count as
    kvmesh_decode_model_steps_total."""
    stats = engine.stats()
    return stats.decode_steps + stats.prefill_steps


def step_cpu_s(engine) -> float:
    """CPU time in the steps that ran the model (both kinds): what the mesh's decode workers count
    as kvmesh_decode_engine_step_cpu_seconds_total."""
    stats = engine.stats()
    return (stats.decode_step_cpu_micros + stats.prefill_step_cpu_micros) / 1e6


def closed_loop(engine, prompts: list[list[int]], params, concurrency: int, tag: str = "r") -> tuple[int, int]:
    """Runs every prompt on the in-process engine, `concurrency` at a time (a finished request's
    successor joins the next step, as a client with zero turnaround would); (output tokens, steps).
    `params`: one SamplingParams for all, or a list of one per prompt."""
    pending, inflight, tokens, steps = list(enumerate(prompts)), 0, 0, 0
    while pending or engine.has_unfinished_requests():
        while pending and inflight < concurrency:
            i, prompt = pending.pop(0)
            engine.add_request(f"{tag}{i}", prompt, params[i] if isinstance(params, list) else params)
            inflight += 1
        steps += 1
        for out in engine.step():
            tokens += len(out.new_token_ids)
            inflight -= out.finished
    return tokens, steps


def _chat_ids(tok, msgs: list[dict]) -> list[int]:
    """The prompt token ids the gateway makes of these chat messages."""
    text = tok.apply_chat_template(msgs, add_generation_prompt=True)
    return tok.encode(text, add_special_tokens=not (tok.bos_token and text.startswith(tok.bos_token)))


def median_run(runs: list[dict]) -> dict:
    """The in-process engine's run with the median CPU per token, with every run's figure in
    `cpu_per_token_runs`: one short run swung 46-99 µs per token with a neighbour's load."""
    ranked = sorted(runs, key=lambda r: r["cpu_s"] / max(1, r["tokens"]))
    return {**ranked[len(ranked) // 2], "cpu_per_token_runs": [r["cpu_s"] / max(1, r["tokens"]) for r in runs]}


def run_engine(model: str, requests: int, concurrency: int, max_tokens: int, vary: bool = False, first: int = 0) -> dict:
    argv = [sys.executable, __file__, "--engine-child", "--model", model, "--requests", str(requests),
            "--concurrency", str(concurrency), "--max-tokens", str(max_tokens), "--first", str(first),
            *(["--vary-tokens"] if vary else [])]
    done = subprocess.run(argv, check=False, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"the load client exited {done.returncode}:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _engine_processes(proc) -> list:
    """A worker's engine process (setting `engine_process`: `python -m kvmesh.<role>.enginehost`), if any."""
    import psutil

    try:
        return [c for c in proc.children(recursive=True) if any(a.endswith(".enginehost") for a in c.cmdline())]
    except psutil.Error:
        return []


def _engine_cpu(proc) -> tuple[str, float] | None:
    """("process" | "thread", CPU s) of a worker's engine: its engine process, or its engine
    thread (the OS thread named `*-engine`); None when it has neither."""
    children = _engine_processes(proc)
    if children:
        return "process", sum(_own_cpu(c) for c in children)
    for t in proc.threads():
        try:
            comm = Path(f"/proc/{proc.pid}/task/{t.id}/comm").read_text().strip()
        except OSError:
            continue
        if comm.endswith("-engine"):
            return "thread", t.user_time + t.system_time
    return None


def _own_cpu(proc) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def _minor_faults(proc) -> int:
    """Minor page faults of a mesh process and its children (Linux: /proc/PID/stat; 0 elsewhere):
    each one a fresh page the kernel zeroed and mapped, ~1-4 µs of the process's CPU. A KV store
    keeps ~2 a token of a model with 8 KiB of KV a token (the blocks it holds); more than its blocks
    is buffers that come and go."""
    import psutil

    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            with open(f"/proc/{p.pid}/stat", "rb") as stat:
                total += int(stat.read().rsplit(b")", 1)[1].split()[7])  # minflt: the 10th field
        except (OSError, IndexError, ValueError, psutil.Error):
            pass
    return total


def _switches(proc) -> int:
    """Context switches of a mesh process and its children, every thread, voluntary (it waited)
    and not (it was preempted): each one is a wake-up, and on a crowded host a cache refilled."""
    import psutil

    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += sum(p.num_ctx_switches())
        except psutil.Error:
            pass
    return total


def process_cpu_s(proc) -> float:
    """A mesh process's CPU time, its children's (a worker's engine process) included."""
    import psutil

    total = _own_cpu(proc)
    for child in proc.children(recursive=True):
        try:
            total += _own_cpu(child)
        except psutil.Error:
            pass
    return total


# -- the mesh ---------------------------------------------------------------------------------
def prompt_offset(round_: int, level: int, levels: int, requests: int) -> int:
    """The first prompt number of a round's load at one level: every load gets prompts of its own,
    so none finds its turns in the KV store already (a level run on prompts an earlier one handed
    back skipped the hand-back, ~5-8 µs a token) and the in-process engine gets the same ones."""
    return (round_ * levels + level) * requests


def measure_mesh(model: str, requests: int, concurrencies: list[int], max_tokens: int, settings: list[str],
                 client_kind: str = "raw", split_lengths: list[int] = (), pin_engines: bool = False,
                 vary: bool = False, rounds: int = 1,
                 engine: Callable[[int, int], dict] | None = None) -> dict:
    """Each level's figures by concurrency, a list of one per round (`vary`: output_lengths). With
    `engine(concurrency, first prompt)`, each load's in-process reference runs right after it
    (while the mesh idles) and is kept under "engine": the two sides of a ratio minutes apart on a
    host whose speed drifts read as much the host as the mesh. With `split_lengths`, also "split":
    one load per output length at the first level (as many tokens in all as a level's), for
    `request_token_split`."""
    import psutil

    from kvmesh.runtime.launcher import MeshOptions, free_port, mesh_cpu_layout
    from kvmesh.runtime.supervisor import Mesh

    served = Path(model).name if model != "tiny" else "tiny"
    results = {}
    with tempfile.TemporaryDirectory() as run_dir:
        opts = MeshOptions(model=model, port=free_port(), run_dir=run_dir, prefill=0, decode=1, settings=settings,
                           pin_engines=pin_engines)
        cpus = mesh_cpu_layout(opts).shared  # NOTE: the load client stays off the engine's CPUs too
        mesh = Mesh(opts)
        mesh.start(timeout_s=180)
        try:
            procs = {r.spec.name: psutil.Process(r.proc.pid) for r in mesh.procs}
            store = _store_endpoint(procs)
            run_client(mesh.gateway_url, served, 8, 8, 8, client_kind, cpus, first=-8)  # warm up
            for round_, (level, c) in ((r, lc) for r in range(rounds) for lc in enumerate(concurrencies)):
                first = prompt_offset(round_, level, len(concurrencies), requests)
                time.sleep(0.6)  # the warm-up's (or the last level's) hand-backs finish, its steps are counted
                counts = _store_counts(store)
                switches_before = {name: _switches(p) for name, p in procs.items()}
                faults_before = {name: _minor_faults(p) for name, p in procs.items()}
                frames = _frame_counts(procs)
                load, cpu, engine_cpu = _cpu_around(
                    procs, lambda start: run_client(mesh.gateway_url, served, requests, c, max_tokens, client_kind, cpus, vary,
                                                    first, start),
                    handed_back(store, counts, requests))
                switches = {name: _switches(p) - switches_before[name] for name, p in procs.items()}
                faults = {name: _minor_faults(p) - faults_before[name] for name, p in procs.items()}
                store_delta = {k: v - counts[k] for k, v in _store_counts(store).items()}
                time.sleep(0.6)  # NOTE: the engine step counter is refreshed with the gauges (every heartbeat, 0.5 s)
                frame_delta = {k: v - frames.get(k, 0.0) for k, v in _frame_counts(procs).items()}
                loop_steps = sum(frame_delta.pop(k) for k in list(frame_delta) if k.endswith(_STEPS))
                timed = {kind: sum(frame_delta.pop(k) for k in list(frame_delta) if k.endswith(kind))
                         for kind in _SUMMED.values()}
                messages = timed.pop("stream messages")
                steps = timed.pop(_MODEL_STEPS) or loop_steps  # NOTE: a checkout without the model-step counter (tokcost-ab.sh)
                results.setdefault(c, []).append({
                    **load, "cpu_s": cpu, "switches": switches, "minor_faults": faults, "engine_thread_cpu_s": engine_cpu,
                    "store": store_delta,
                    "frames": frame_delta, "engine_steps": steps, "engine_loop_steps": loop_steps, "engine_time_s": timed, "stream_messages": messages,
                    **({"engine": engine(c, first)} if engine is not None else {})})
            first = prompt_offset(rounds, 0, len(concurrencies), requests)
            for length in split_lengths:
                time.sleep(0.6)
                n = max(8, requests * max_tokens // length)
                counts = _store_counts(store)
                load, cpu, engine_cpu = _cpu_around(procs, lambda start, length=length, n=n, first=first: run_client(
                    mesh.gateway_url, served, n, concurrencies[0], length, client_kind, cpus, first=first, on_ready=start),
                    handed_back(store, counts, n))
                first += n
                results.setdefault("split", []).append(
                    {"requests": load["requests"], "tokens": load["tokens"], "cpu_s": {**cpu, **engine_cpu}})
        finally:
            mesh.stop()
    return results


def _cpu_around(procs: dict, run: Callable[[Callable[[], None]], dict],
                settled: Callable[[], None]) -> tuple[dict, dict[str, float], dict[str, float]]:
    """`run(start)` with each mesh process's CPU time and its engine's read when it calls `start()`
    (the load's first request) and again once `settled()` returns (the hand-backs of the last turns
    are part of the cost). (run's result, CPU s by process, CPU s by "<process>: its engine <process|thread>")."""
    before: dict[str, float] = {}
    engines_before: dict = {}

    def start() -> None:
        before.update({name: process_cpu_s(p) for name, p in procs.items()})
        engines_before.update({name: _engine_cpu(p) for name, p in procs.items()})

    result = run(start)
    settled()
    cpu = {name: process_cpu_s(p) - before[name] for name, p in procs.items()}
    engines = {f"{name}: its engine {kind}": s - engines_before[name][1]
               for name, p in procs.items() if engines_before[name] is not None for kind, s in [_engine_cpu(p)]}
    return result, cpu, engines


def handed_back(store: str, counts: dict, turns: int, limit_s: float = 0.5, poll_s: float = 0.05) -> Callable[[], None]:
    """Waits (at most `limit_s`) until the KV store has looked up `turns` more hand-back turns than
    in `counts` and its Put count has held still for one `poll_s`: the load's last hand-backs are
    done. With no store (or the hand-back off, when the lookups never come) it waits `limit_s`.
    Each poll is one Stats call on an open channel, ~0.3 ms of the store's CPU, which counts."""
    def wait() -> None:
        deadline, puts = time.monotonic() + limit_s, None
        while time.monotonic() < deadline:
            time.sleep(poll_s)
            now = _store_counts(store) if store else {}
            if now and now["lookups"] - counts["lookups"] >= turns and now["puts"] == puts:
                return
            puts = now.get("puts")
    return wait


_FRAME_METRICS = ("kvmesh_scheduler_route_stream_frames_total", "kvmesh_decode_stream_frames_total",
                  "kvmesh_decode_engine_steps_total")
_STEPS = "engine steps"  # the kind `_frame_counts` gives the step counter (it has no kind label)
# NOTE: the loop's step counter above also counts steps that ran no model (a command frame woke an
# idle engine: a hand-back's pin, read and unpin after the load; an add before any request ran),
# ~5 of a load's ~560 at c=32, which read as partial batches. These count the model's runs.
_MODEL_STEPS = "model steps"
_ENGINE_TIME = {"kvmesh_decode_engine_busy_seconds_total": "engine busy s",  # steps' wall time, both kinds
                "kvmesh_decode_engine_between_steps_seconds_total": "engine between s",  # work left, not stepping
                "kvmesh_decode_engine_step_cpu_seconds_total": "engine step cpu s"}  # the steps' own CPU, both kinds
_SUMMED = {**_ENGINE_TIME, "kvmesh_decode_stream_messages_total": "stream messages",  # StepOutputs sent
           "kvmesh_decode_model_steps_total": _MODEL_STEPS}  # both kinds


def _frame_counts(procs: dict) -> dict[str, float]:
    """Frames the scheduler read on Routes streams and the decode workers on token streams, by
    kind ("scheduler batch", "decode-0 generate", ...), from their /metrics; {} on older checkouts."""
    import urllib.request

    out: dict[str, float] = {}
    for name, proc in procs.items():
        argv = proc.cmdline()
        if "--metrics-port" not in argv or not (name == "scheduler" or name.startswith("decode")):
            continue
        url = f"http://127.0.0.1:{argv[argv.index('--metrics-port') + 1]}/metrics"
        with urllib.request.urlopen(url, timeout=10) as reply:
            read_counts(name, reply.read().decode(), out)
    return out


def read_counts(name: str, metrics_text: str, out: dict[str, float]) -> None:
    """Adds process `name`'s counters from its /metrics text to `out` (see `_frame_counts`)."""
    for line in metrics_text.splitlines():
        timed = _SUMMED.get(line.split("{")[0].split(" ")[0])
        if timed:
            key = f"{name} {timed}"
            out[key] = out.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
        elif line.startswith(_FRAME_METRICS):
            kind = line.split('kind="', 1)[1].split('"', 1)[0] if 'kind="' in line else _STEPS
            out[f"{name} {kind}"] = float(line.rsplit(" ", 1)[1])


def _store_endpoint(procs: dict) -> str:
    """host:port of the mesh's (single) KV store, from its command line; "" when there is none."""
    argv = procs["kvstore"].cmdline() if "kvstore" in procs else []
    return f"{argv[argv.index('--host') + 1]}:{argv[argv.index('--port') + 1]}" if "--port" in argv else ""


_channels: dict = {}  # endpoint -> one open gRPC channel: a channel a call cost the store a connection each


def _store_counts(endpoint: str) -> dict:
    """The KV store's Lookup (chains looked up, and calls) and Put counts and blocks held (what the hand-back did)."""
    if not endpoint:
        return {}
    import grpc

    from kvmesh.runtime.pb import kvstore_pb2, kvstore_pb2_grpc

    if endpoint not in _channels:
        _channels[endpoint] = grpc.insecure_channel(endpoint)
    stats = kvstore_pb2_grpc.KvStoreStub(_channels[endpoint]).Stats(kvstore_pb2.StatsRequest(), timeout=10)
    counts = {"lookups": stats.lookups, "puts": stats.puts, "blocks": sum(t.blocks for t in stats.tiers)}
    if hasattr(stats, "lookup_calls"):  # NOTE: tokcost-ab.sh runs this file on older kvmesh checkouts too
        counts["lookup_calls"] = stats.lookup_calls
    return counts


def decode_split(mesh: dict, engine: dict) -> dict[str, float]:
    """The decode worker's CPU per token above the in-process engine's, in three parts (they add
    up to it). With both sides' step CPU (`kvmesh_decode_engine_step_cpu_seconds_total`, and
    `step_cpu_s` of the in-process engine): the engine steps' CPU above the in-process engine's
    (more or smaller steps: a wave's requests arriving over several steps; a crowded host; less
    the in-process engine's detokenizing and stop checks, which in the mesh the gateway does), its
    engine process's CPU beside those steps above the in-process engine's beside its own (commands,
    step frames, hand-back reads), and the worker's own CPU beside its engine (gRPC, asyncio,
    hand-backs). Without them (an older checkout): the mesh's smaller batches at the in-process
    engine's CPU per step, its engine's CPU per step above the in-process one's, and the worker's.
    {} without a step count or an engine."""
    tokens, steps = mesh["tokens"], mesh.get("engine_steps")
    engines = {k: v for k, v in mesh.get("engine_thread_cpu_s", {}).items() if k.startswith("decode")}
    if not tokens or not steps or not engine.get("steps") or not engines:
        return {}
    engine_cpu = sum(engines.values())
    worker_cpu = sum(v for k, v in mesh["cpu_s"].items() if k.startswith("decode"))
    step_cpu = (mesh.get("engine_time_s") or {}).get("engine step cpu s")
    if step_cpu and engine.get("step_cpu_s"):
        inproc_step, inproc_beside = engine["step_cpu_s"], engine["cpu_s"] - engine["step_cpu_s"]
        return {
            "engine steps": (step_cpu / tokens - inproc_step / engine["tokens"]) * 1e6,
            "engine process beside its steps": ((engine_cpu - step_cpu) / tokens - inproc_beside / engine["tokens"]) * 1e6,
            "beside the engine": (worker_cpu - engine_cpu) / tokens * 1e6,
        }
    step_inproc = engine["cpu_s"] / engine["steps"]
    batch = tokens / steps
    per_token_inproc = engine["cpu_s"] / engine["tokens"]
    return {
        "batches": (step_inproc / batch - per_token_inproc) * 1e6,
        "CPU per step": (engine_cpu / steps - step_inproc) / batch * 1e6,
        "beside the engine": (worker_cpu - engine_cpu) / tokens * 1e6,
    }


def request_token_split(runs: list[dict]) -> dict[str, tuple[float, float]]:
    """Each process's CPU as (µs per request, µs per output token), fitted by least squares over
    loads of different output lengths ({"requests", "tokens", "cpu_s": {process: s}} each): what
    a process spends once per request (HTTP, routing, spans, the engine's add) against what it
    spends on every token (step frames, deltas, SSE chunks). Needs two or more lengths."""
    import numpy as np

    if len({r["tokens"] / max(1, r["requests"]) for r in runs}) < 2:
        raise ValueError("the split needs loads of at least two output lengths")
    design = np.array([[r["requests"], r["tokens"]] for r in runs], dtype=float)
    cpu = np.array([[r["cpu_s"][name] for name in runs[0]["cpu_s"]] for r in runs])
    coef = np.linalg.lstsq(design, cpu, rcond=None)[0] * 1e6  # cpu = a * requests + b * tokens, per process
    return {name: (float(coef[0, j]), float(coef[1, j])) for j, name in enumerate(runs[0]["cpu_s"])}


def report_split(split: dict[str, tuple[float, float]], concurrency: int, lengths: list[int]) -> None:
    print(f"\nper request and per token (concurrency {concurrency}, loads of {', '.join(map(str, lengths))} "
          f"tokens a request, least squares):")
    print("| process | µs per request | µs per token | at 128 tokens a request, µs per token |\n|---|---|---|---|")
    engines = {k: v for k, v in split.items() if ": its engine" in k}
    rows = {k: v for k, v in split.items() if k not in engines}
    for name, (per_request, per_token) in sorted(rows.items(), key=lambda kv: -(kv[1][0] / 128 + kv[1][1])):
        print(f"| {name} | {per_request:.0f} | {per_token:.1f} | {per_request / 128 + per_token:.1f} |")
    a = sum(v[0] for v in rows.values())
    b = sum(v[1] for v in rows.values())
    print(f"| **mesh total** | **{a:.0f}** | **{b:.1f}** | **{a / 128 + b:.1f}** |")
    for name, (per_request, per_token) in sorted(engines.items()):
        print(f"| {name} (in its row above) | {per_request:.0f} | {per_token:.1f} | {per_request / 128 + per_token:.1f} |")


def ratios(mesh: dict) -> dict[str, float]:
    """One load's headline figures against its own in-process reference (`mesh["engine"]`)."""
    engine, tokens = mesh["engine"], max(1, mesh["tokens"])
    eng = engine["cpu_s"] / max(1, engine["tokens"]) * 1e6
    decode = sum(cpu for name, cpu in mesh["cpu_s"].items() if name.startswith("decode")) / tokens * 1e6
    return {"cpu": sum(mesh["cpu_s"].values()) / tokens * 1e6 / eng,
            "throughput": (mesh["tokens"] / mesh["wall_s"]) / (engine["tokens"] / engine["wall_s"]),
            "gateway": mesh["cpu_s"].get("gateway", 0.0) / tokens * 1e6, "decode above": decode - eng, "engine": eng}


def median_round(rounds: list[dict]) -> dict:
    """The round whose mesh total / engine ratio is the median (the lower middle of an even count)."""
    return sorted(rounds, key=lambda m: ratios(m)["cpu"])[(len(rounds) - 1) // 2]


def report_rounds(c: int, rounds: list[dict]) -> None:
    figures = [ratios(m) for m in rounds]

    def row(key: str, fmt: str) -> str:
        values = sorted(f[key] for f in figures)
        return ", ".join(format(f[key], fmt) for f in figures) + f" (median {format(values[(len(values) - 1) // 2], fmt)})"

    print(f"rounds at concurrency {c}, in order: mesh total / engine {row('cpu', '.2f')}; throughput {row('throughput', '.2f')}; "
          f"in-process engine µs per token {row('engine', '.0f')}; gateway µs per token {row('gateway', '.0f')}; "
          f"decode worker above engine {row('decode above', '+.0f')}")


def report(c: int, mesh: dict) -> None:
    """One load's figures against its own in-process reference (`mesh["engine"]`)."""
    engine, figures = mesh["engine"], ratios(mesh)
    tokens, eng = max(1, mesh["tokens"]), figures["engine"]
    per = {name: cpu / tokens * 1e6 for name, cpu in sorted(mesh["cpu_s"].items(), key=lambda kv: -kv[1])}
    total = sum(per.values())
    print(f"\nconcurrency {c}: mesh {mesh['tokens']} tokens ({mesh['failures']} failed requests), "
          f"engine {engine['tokens']} tokens")
    print(f"| process | CPU µs per token |\n|---|---|")
    for name, us in per.items():
        print(f"| {name} | {us:.0f} |")
    print(f"| **mesh total** | **{total:.0f}** |")
    for name, cpu in sorted(mesh.get("engine_thread_cpu_s", {}).items()):
        share = cpu / max(1e-9, mesh["cpu_s"].get(name.split(":")[0], 0.0))
        print(f"| {name} | {cpu / tokens * 1e6:.0f} ({share:.0%} of the process row) |")
    spread = engine.get("cpu_per_token_runs", [])
    runs = f" (median of {len(spread)} runs: {min(spread) * 1e6:.0f}-{max(spread) * 1e6:.0f})" if len(spread) > 1 else ""
    print(f"| in-process engine, same prompts | {eng:.0f}{runs} |")
    if mesh.get("store"):
        st = mesh["store"]
        calls = f" in {st['lookup_calls']} calls" if "lookup_calls" in st else ""
        print(f"KV store: {st['lookups']} Lookups (turns handed back){calls}, {st['puts']} Puts, {st['blocks']:+d} blocks held")
    if mesh.get("frames"):
        requests = max(1, mesh.get("requests", 0))
        print("frames read per request: " + ", ".join(f"{k} {v / requests:.2f}" for k, v in sorted(mesh["frames"].items()) if v))
    steps = mesh.get("engine_steps")
    if steps and engine.get("steps"):
        loop = mesh.get("engine_loop_steps") or steps
        print(f"tokens per engine step (the mean batch): mesh {tokens / steps:.1f}, in-process engine "
              f"{engine['tokens'] / engine['steps']:.1f} (steps that ran the model: mesh {steps:.0f}, in-process "
              f"{engine['steps']}; the mesh's engine loop stepped {loop:.0f} times)")
        if mesh.get("stream_messages"):
            print(f"token-stream messages (StepOutput) per engine step: {mesh['stream_messages'] / steps:.2f}")
        timed = mesh.get("engine_time_s") or {}
        busy, between = timed.get("engine busy s", 0.0), timed.get("engine between s", 0.0)
        if busy:
            print(f"the engine stepping: {busy:.2f} s; with work left and not stepping (its loop's commands, the GIL): "
                  f"{between:.2f} s, {between / busy:.0%} of that")
        step_cpu = timed.get("engine step cpu s", 0.0)
        if step_cpu and engine.get("step_cpu_s"):
            print(f"the engine steps' own CPU: mesh {step_cpu / tokens * 1e6:.0f} µs per token ({step_cpu / steps * 1e3:.2f} ms "
                  f"a step), in-process engine {engine['step_cpu_s'] / max(1, engine['tokens']) * 1e6:.0f} "
                  f"({engine['step_cpu_s'] / engine['steps'] * 1e3:.2f} ms a step)")
        split = decode_split(mesh, engine)
        if split:
            print("decode worker above engine, split: " + ", ".join(f"{k} {v:+.0f}" for k, v in split.items()) + " µs per token")
    if mesh.get("switches"):
        print("context switches per 100 tokens: " + ", ".join(
            f"{name} {n / tokens * 100:.0f}" for name, n in sorted(mesh["switches"].items(), key=lambda kv: -kv[1])))
    if mesh.get("minor_faults"):
        print("minor page faults per 100 tokens: " + ", ".join(
            f"{name} {n / tokens * 100:.0f}" for name, n in sorted(mesh["minor_faults"].items(), key=lambda kv: -kv[1])))
    if "client_cpu_s" in mesh:
        print(f"the load client (not in the mesh total): {mesh['client_cpu_s'] / tokens * 1e6:.0f} µs per token")
    if mesh.get("ttft_s"):
        ttft = mesh["ttft_s"]
        print(f"client TTFT (send to first content chunk): p50 {ttft[len(ttft) // 2] * 1e3:.1f} ms, "
              f"p90 {ttft[int(len(ttft) * 0.9)] * 1e3:.1f} ms, mean {sum(ttft) / len(ttft) * 1e3:.1f} ms")
    if mesh.get("chunks"):
        print(f"SSE content chunks per token: {mesh['chunks'] / tokens:.2f} (below 1: a reader fell behind and its tokens "
              f"coalesced); gateway CPU per chunk: {mesh['cpu_s']['gateway'] / mesh['chunks'] * 1e6:.0f} µs")
    print(f"mesh total / engine: {figures['cpu']:.2f}x; decode worker above engine: {figures['decode above']:+.0f} µs; "
          f"throughput mesh {mesh['tokens'] / mesh['wall_s']:.0f} tok/s / engine {engine['tokens'] / engine['wall_s']:.0f} "
          f"tok/s = {figures['throughput']:.2f}x")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny", help="'tiny' or an HF model directory")
    p.add_argument("--requests", type=int, default=128)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--concurrency", default="32,64", help="comma-separated concurrency levels, each once")
    p.add_argument("--vary-tokens", action="store_true",
                   help="spread the requests' output lengths over 1/2 .. 3/2 of --max-tokens (same mean) on both sides: "
                        "with one length for all, a closed loop's requests finish and arrive in waves")
    p.add_argument("--set", action="append", default=[], metavar="SERVICE.FIELD=VALUE", help="mesh settings")
    p.add_argument("--client-kind", choices=["raw", "httpx"], default="raw",
                   help="the load generator: raw HTTP/1.1 on uvloop (bench/sseload.py, the lean one) or httpx")
    p.add_argument("--engine-runs", type=int, default=3,
                   help="runs of the in-process engine after each load; the one with the median CPU per token is the reference")
    p.add_argument("--rounds", type=int, default=1,
                   help="loads per level, each on prompts of its own and each with its own in-process reference right "
                        "after it; the round with the median ratio is shown, the others summed up")
    p.add_argument("--split", default="", metavar="N,M",
                   help="also split each process's CPU into per request and per token, from loads of these output "
                        "lengths at the first concurrency level (e.g. 16,256)")
    p.add_argument("--json", default="", metavar="FILE", help="also write every round's raw figures to FILE")
    p.add_argument("--pin-engines", action="store_true",
                   help="start the mesh as `kvmesh up --pin-engines` does (the engine on a CPU of its own; the load client "
                        "with the mesh's other processes)")
    p.add_argument("--client", help=argparse.SUPPRESS)
    p.add_argument("--served", help=argparse.SUPPRESS)
    p.add_argument("--engine-child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.client:
        print(json.dumps(client_child(args.client_kind, args.client, args.served, args.requests, int(args.concurrency),
                                      args.max_tokens, args.vary_tokens, args.first, _ready_then_wait)))
        return 0
    if args.engine_child:
        print(json.dumps(engine_child(args.model, args.requests, int(args.concurrency), args.max_tokens, args.vary_tokens,
                                      args.first)))
        return 0
    levels = [int(c) for c in args.concurrency.split(",")]
    if len(set(levels)) != len(levels):
        p.error("--concurrency: each level once (the figures are kept by level)")
    if args.rounds < 1:
        p.error("--rounds: at least 1")
    load_before = os.getloadavg()[0]
    lengths = [int(x) for x in args.split.split(",") if x]

    def engine(c: int, first: int) -> dict:
        return median_run([run_engine(args.model, args.requests, c, args.max_tokens, args.vary_tokens, first)
                           for _ in range(max(1, args.engine_runs))])

    mesh = measure_mesh(args.model, args.requests, levels, args.max_tokens, args.set, args.client_kind, lengths,
                        args.pin_engines, args.vary_tokens, args.rounds, engine)
    if args.json:
        Path(args.json).write_text(json.dumps({str(k): v for k, v in mesh.items()}, indent=1))
    length = f"{args.max_tokens // 2}-{args.max_tokens * 3 // 2} (mean ~{args.max_tokens})" if args.vary_tokens else args.max_tokens
    print(f"{args.requests} streamed chat requests x {length} tokens, model {args.model}, "
          f"{os.cpu_count()} CPUs{' (engine pinned)' if args.pin_engines else ''}, niceness {os.nice(0)}, "
          f"{args.client_kind} load client, load average {load_before:.1f} before the mesh, "
          f"{os.getloadavg()[0]:.1f} after it")
    for c in levels:
        shown = median_round(mesh[c])
        report(c, shown)
        if len(mesh[c]) > 1:
            report_rounds(c, mesh[c])
    if lengths:
        report_split(request_token_split(mesh["split"]), levels[0], lengths)
    return 0


if __name__ == "__main__":
    sys.exit(main())
