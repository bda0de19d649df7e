"""Priority end to end: a high-priority request sent into a queue of low-priority ones is
admitted and finishes before them (field or X-Request-Priority header), on a real mesh whose
admission has one slot."""

from __future__ import annotations

import threading
import time

import pytest

from .polling import eventually

pytestmark = pytest.mark.e2e


def test_high_priority_jumps_the_admission_queue(start_mesh):
    handle = start_mesh(prefill=0, decode=1, kvstore=False,
                        settings=["decode.max_num_seqs=1", "scheduler.admission_queue_factor=8"])
    client = handle.openai_client()
    finished: dict[str, float] = {}

    def run(name: str, **kwargs) -> None:
        # NOTE: the first request holds the one slot long enough for the queue to build behind it.
        client.completions.create(model="tiny", prompt=f"request {name}", max_tokens=1000 if name == "running" else 16,
                                  temperature=0,
                                  extra_body={"ignore_eos": True, **kwargs.pop("extra_body", {})}, **kwargs)
        finished[name] = time.monotonic()

    def queued() -> float:
        return handle.metric("scheduler", "kvmesh_scheduler_queue_depth")

    threads = [threading.Thread(target=run, args=("running",), kwargs={"extra_body": {"priority": 5}})]
    threads[0].start()
    assert eventually(lambda: handle.metric("decode-0", "kvmesh_decode_running_requests") >= 1, 20)
    for i in range(3):
        threads.append(threading.Thread(target=run, args=(f"low{i}",), kwargs={"extra_body": {"priority": 5}}))
        threads[-1].start()
        assert eventually(lambda n=i + 1: queued() >= n, 20)
    threads.append(threading.Thread(target=run, args=("high",), kwargs={"extra_headers": {"X-Request-Priority": "-5"}}))
    threads[-1].start()
    for t in threads:
        t.join(timeout=120)
    assert set(finished) == {"running", "low0", "low1", "low2", "high"}
    assert finished["high"] < min(finished[f"low{i}"] for i in range(3))
    assert handle.metric("scheduler", "kvmesh_scheduler_admission_wait_seconds_count", priority="high") == 1
    assert handle.metric("scheduler", "kvmesh_scheduler_admission_wait_seconds_count", priority="low") == 4
