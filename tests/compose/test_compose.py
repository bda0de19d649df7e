"""compose.yaml under a real Docker engine (compose.test.yaml supplies what no registry gives
here): health order, a streamed chat completion with the `openai` client, three decode replicas
registered and all serving, Prometheus scraping every replica, a decode container killed
mid-stream without a stream failing or changing, and `down -v` leaving nothing behind.
Every request goes through ports published on 127.0.0.1. Run by `make test-compose`."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import openai

from .conftest import DECODE_REPLICAS
from .stack import eventually

KVMESH_JOBS = {"gateway": 1, "scheduler": 1, "prefill": 1, "decode": DECODE_REPLICAS, "kvstore": 1, "canary": 1}


def client(stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{stack.port('gateway', 8000)}/v1", api_key="unused",
                         timeout=120, max_retries=0)


def model(stack) -> str:
    return client(stack).models.list().data[0].id


def healthy_at(events: list[dict], service: str) -> float:
    """When the first container of `service` turned healthy (seconds, from Docker's events)."""
    times = [e["timeNano"] / 1e9 for e in events
             if e["Actor"]["Attributes"].get("com.docker.compose.service") == service
             and e["status"] == "health_status: healthy"]
    assert times, f"{service} never turned healthy"
    return min(times)


def started_at(events: list[dict], service: str) -> float:
    times = [e["timeNano"] / 1e9 for e in events
             if e["Actor"]["Attributes"].get("com.docker.compose.service") == service and e["status"] == "start"]
    assert times, f"{service} never started"
    return min(times)


def test_image_is_lean(stack) -> None:
    """The CPU image: at most 1.1 GB, and no pip, compilers or test extras in it."""
    size = int(stack.docker("image", "inspect", "-f", "{{.Size}}", "kvmesh:local"))
    assert size <= 1.1e9, f"kvmesh:local is {size / 1e9:.2f} GB"
    probe = ("import importlib.util as u, shutil; "
             "print([m for m in ('pip', 'setuptools', 'pytest', 'schemathesis', 'grpc_tools', 'triton')"
             " if u.find_spec(m)] + [t for t in ('gcc', 'cc', 'make', 'pip') if shutil.which(t)])")
    assert stack.docker("run", "--rm", "kvmesh:local", "python", "-c", probe).strip() == "[]"


def test_healthchecks_turn_healthy_in_order(stack) -> None:
    for service in ("gateway", "scheduler", "kvstore", "prefill", "decode", "canary", "nats", "prometheus"):
        assert eventually(lambda s=service: set(stack.health(s)) == {"healthy"}, 300), \
            f"{service}: {stack.health(service)}\n{stack.compose('logs', '--tail', '30', service)}"
    events = list(stack.events)
    nats, scheduler, gateway = (healthy_at(events, s) for s in ("nats", "scheduler", "gateway"))
    assert nats <= started_at(events, "scheduler") < scheduler, "the scheduler starts once NATS is healthy"
    assert scheduler <= started_at(events, "gateway") < gateway, "the gateway starts once the scheduler is healthy"
    for worker in ("prefill", "decode"):
        assert scheduler <= started_at(events, worker), f"{worker} starts once the scheduler is healthy"


def test_streamed_chat_completion_with_the_openai_client(stack) -> None:
    chunks = list(client(stack).chat.completions.create(
        model=model(stack), messages=[{"role": "user", "content": "Hello from a container"}],
        max_tokens=16, temperature=0, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[0].id.startswith("chatcmpl-") and text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 16


def decode_requests_by_instance(stack) -> dict[str, float]:
    """Each decode replica's finished requests (every status), as Prometheus last scraped them."""
    return {r["metric"]["instance"]: float(r["value"][1])
            for r in stack.promql('sum by (instance) (kvmesh_decode_requests_total{job="decode"})')}


def decode_statuses(stack) -> dict[str, float]:
    return {r["metric"]["status"]: float(r["value"][1])
            for r in stack.promql('sum by (status) (kvmesh_decode_requests_total{job="decode"})')}


def test_three_decode_replicas_register_and_all_serve(stack) -> None:
    registered = lambda: sum(float(r["value"][1]) for r in stack.promql(  # noqa: E731
        'kvmesh_scheduler_workers{role="decode"}')) == DECODE_REPLICAS
    assert eventually(registered, 120), stack.promql("kvmesh_scheduler_workers")
    # NOTE: the counters as of now, not as of the last scrape: the earlier tests' requests ended
    # moments ago, and a replica scraped before they did would count them as this test's.
    assert stack.scraped_since("decode", time.time(), DECODE_REPLICAS), stack.promql('timestamp(up{job="decode"})')
    before, statuses = decode_requests_by_instance(stack), decode_statuses(stack)  # a counter appears with its first request
    api, name = client(stack), model(stack)
    prompts = [f"Request {i}: tell me about container number {i * 7 + 3}" for i in range(24)]

    def ask(prompt: str) -> int:
        reply = api.chat.completions.create(model=name, messages=[{"role": "user", "content": prompt}],
                                            max_tokens=24, temperature=0, extra_body={"ignore_eos": True})
        return reply.usage.completion_tokens

    with ThreadPoolExecutor(max_workers=24) as pool:
        assert list(pool.map(ask, prompts)) == [24] * 24
    assert stack.scraped_since("decode", time.time(), DECODE_REPLICAS), stack.promql('timestamp(up{job="decode"})')
    after = decode_requests_by_instance(stack)
    delta = {i: after[i] - before.get(i, 0.0) for i in after}
    by_status = {s: n - statuses.get(s, 0.0) for s, n in decode_statuses(stack).items() if n != statuses.get(s, 0.0)}
    assert sum(delta.values()) == 24, f"decode requests per replica: {delta}; by status: {by_status}"
    assert len(delta) == DECODE_REPLICAS and all(n > 0 for n in delta.values()), f"requests per replica: {delta}"


def test_prometheus_scrapes_every_replica(stack) -> None:
    addresses = {stack.address(c) for c in stack.containers("decode")}
    assert len(addresses) == DECODE_REPLICAS

    def targets() -> dict[str, list[str]] | None:
        up = stack.promql("up")
        by_job: dict[str, list[str]] = {}
        for r in up:
            if r["value"][1] == "1":
                by_job.setdefault(r["metric"]["job"], []).append(r["metric"]["instance"])
        return by_job if all(len(by_job.get(j, [])) == n for j, n in KVMESH_JOBS.items()) else None

    by_job = eventually(targets, 60)
    assert by_job, stack.promql("up")
    assert {i.rsplit(":", 1)[0] for i in by_job["decode"]} == addresses
    assert all(r["value"][1] == "1" for r in stack.promql("up") if r["metric"]["job"] in KVMESH_JOBS)


def test_decode_container_killed_mid_stream(stack) -> None:
    """Each prompt streams again and again, so every decode replica has streams in flight, until a
    replica Prometheus saw running requests gets `docker kill`. Every stream, the cut ones too,
    completes with the text an undisturbed run gave (greedy), and the gateway moved the cut ones."""
    api, name = client(stack), model(stack)
    prompts = [f"Stream {i}: a long story about ship {i * 11 + 5}" for i in range(12)]
    stop = threading.Event()

    def stream(prompt: str) -> str:
        text = ""
        for chunk in api.completions.create(model=name, prompt=prompt, max_tokens=1000, temperature=0,
                                            stream=True, extra_body={"ignore_eos": True}):
            text += chunk.choices[0].text if chunk.choices else ""
        return text

    def keep_streaming(prompt: str) -> list[tuple[str, float, float]]:  # (text, began, ended) of each
        runs = []
        while not stop.is_set():
            began = time.time()
            runs.append((stream(prompt), began, time.time()))
        return runs

    with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        undisturbed = dict(zip(prompts, pool.map(stream, prompts), strict=True))
    assert all(undisturbed.values())

    with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        futures = {p: pool.submit(keep_streaming, p) for p in prompts}
        loaded_since = time.time()

        def busy_replica() -> str | None:  # a decode container running requests at a scrape since then
            series = 'kvmesh_decode_running_requests{job="decode"}'
            running = stack.promql(f"{series} > 0 and timestamp({series}) > {loaded_since:.3f}")
            by_address = {stack.address(c): c for c in stack.containers("decode")}
            hosts = [by_address.get(r["metric"]["instance"].rsplit(":", 1)[0]) for r in running]
            return next((h for h in hosts if h), None)

        try:
            victim = eventually(busy_replica, 30, every_s=0.5)
            assert victim, "no decode replica showed running requests while the streams ran"
            stack.docker("kill", victim)
            killed_at = time.time()
        finally:
            stop.set()
        runs = {p: f.result(timeout=300) for p, f in futures.items()}
    assert any(began < killed_at < ended for rs in runs.values() for _, began, ended in rs), "no stream ran at the kill"
    changed = [(p, text) for p, rs in runs.items() for text, _, _ in rs if text != undisturbed[p]]
    assert not changed, f"{len(changed)} streams differ from the undisturbed run, e.g. {changed[0]}"
    # NOTE: a worker's id is decode-<hostname>-<pid>, and a container's hostname its short id.
    cut = f"decode worker decode-{victim[:12]}-"
    moved = [line for line in stack.compose("logs", "--no-color", "gateway").splitlines()
             if cut in line and " failed (" in line]
    assert moved, f"no stream was cut by the kill (the gateway moved none off {cut})"


def test_down_removes_every_container_network_and_volume(stack) -> None:
    assert stack.leftovers()["volumes"], "the project's named volumes exist while it runs"
    stack.compose("down", "-v", "--remove-orphans", "--timeout", "10")
    assert stack.leftovers() == {"containers": [], "networks": [], "volumes": []}
