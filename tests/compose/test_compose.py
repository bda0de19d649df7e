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
    return {r["metric"]["instance"]: float(r["value"][1])
            for r in stack.promql('sum by (instance) (kvmesh_decode_requests_total{job="decode"})')}


def test_three_decode_replicas_register_and_all_serve(stack) -> None:
    registered = lambda: sum(float(r["value"][1]) for r in stack.promql(  # noqa: E731
        'kvmesh_scheduler_workers{role="decode"}')) == DECODE_REPLICAS
    assert eventually(registered, 120), stack.promql("kvmesh_scheduler_workers")
    before = decode_requests_by_instance(stack)  # NOTE: a replica's counter appears with its first request
    api, name = client(stack), model(stack)
    prompts = [f"Request {i}: tell me about container number {i * 7 + 3}" for i in range(24)]

    def ask(prompt: str) -> int:
        reply = api.chat.completions.create(model=name, messages=[{"role": "user", "content": prompt}],
                                            max_tokens=24, temperature=0, extra_body={"ignore_eos": True})
        return reply.usage.completion_tokens

    with ThreadPoolExecutor(max_workers=24) as pool:
        assert list(pool.map(ask, prompts)) == [24] * 24

    def served() -> dict[str, float] | None:
        after = decode_requests_by_instance(stack)
        delta = {i: after.get(i, 0.0) - before.get(i, 0.0) for i in after}
        return delta if sum(delta.values()) >= 24 else None

    delta = eventually(served, 30)
    assert delta and sum(delta.values()) == 24, delta
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
    """Streams run while one decode container serving some of them gets `docker kill`: every
    stream completes with the text an undisturbed run gave (greedy)."""
    api, name = client(stack), model(stack)
    prompts = [f"Stream {i}: a long story about ship {i * 11 + 5}" for i in range(12)]
    # NOTE: 12 long streams keep every replica busy for many seconds, so a 5 s scrape sees them.
    max_tokens = 1800

    def stream(prompt: str, first: threading.Event | None = None) -> tuple[str, float]:
        text = ""
        for chunk in api.completions.create(model=name, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                            stream=True, extra_body={"ignore_eos": True}):
            text += chunk.choices[0].text if chunk.choices else ""
            if first is not None:
                first.set()
        return text, time.time()

    with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        undisturbed = [text for text, _ in pool.map(stream, prompts)]
    assert all(undisturbed)

    started = [threading.Event() for _ in prompts]
    with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        futures = [pool.submit(stream, p, e) for p, e in zip(prompts, started, strict=True)]
        assert all(e.wait(120) for e in started)
        streaming_since = time.time()

        def busy_replica() -> str | None:  # a decode container running requests at a scrape since then
            series = 'kvmesh_decode_running_requests{job="decode"}'
            running = stack.promql(f"{series} > 0 and timestamp({series}) > {streaming_since:.3f}")
            by_address = {stack.address(c): c for c in stack.containers("decode")}
            hosts = [by_address.get(r["metric"]["instance"].rsplit(":", 1)[0]) for r in running]
            return next((h for h in hosts if h), None)

        victim = eventually(busy_replica, 30, every_s=0.5)
        assert victim, "no decode replica showed running requests while the streams ran"
        stack.docker("kill", victim)
        killed_at = time.time()
        results = [f.result(timeout=300) for f in futures]
    assert any(done > killed_at for _, done in results), "every stream ended before the kill"
    assert [text for text, _ in results] == undisturbed
    moved = [line for line in stack.compose("logs", "--no-color", "gateway").splitlines()
             if "decode worker" in line and " failed (" in line]
    assert moved, "no stream was cut by the kill (the gateway moved none to another worker)"


def test_down_removes_every_container_network_and_volume(stack) -> None:
    assert stack.leftovers()["volumes"], "the project's named volumes exist while it runs"
    stack.compose("down", "-v", "--remove-orphans", "--timeout", "10")
    assert stack.leftovers() == {"containers": [], "networks": [], "volumes": []}
