"""bench/reqpath.py's join of a client's request with the mesh's spans."""

from __future__ import annotations

import json

import pytest

from kvmesh.runtime.tracecli import parse_lines

from .benchmodule import bench_module


def test_the_segments_follow_the_request_from_its_send_to_its_first_chunk() -> None:
    reqpath = bench_module("reqpath")
    ms = 1_000_000
    records = [
        {"name": "gateway.request", "start_ns": 3 * ms, "attributes": {"kvmesh.request_id": "cmpl-1"},
         "events": [{"name": "routed", "time_ns": 5 * ms}, {"name": "routed", "time_ns": 9 * ms}]},
        {"name": "decode.generate", "start_ns": 10 * ms,
         "attributes": {"request_id": "cmpl-1", "ttft_s": 0.004, "engine_queue_s": 0.0005, "engine_prefill_s": 0.0025}},
        {"name": "scheduler.route", "start_ns": 4 * ms, "attributes": {}},
        {"name": "gateway.request", "start_ns": 3 * ms, "attributes": {"kvmesh.request_id": "cmpl-2"}, "events": []},
    ]
    lines = [json.dumps({"trace_id": f"{i:032x}", "span_id": f"{i:016x}", "end_ns": 20 * ms, **r}) for i, r in enumerate(records)]
    found, bad = parse_lines([*lines, '{"name": "gateway.req'])  # NOTE: as `kvmesh trace` reads them: a half-written tail
    assert bad == 1
    spans = reqpath.read_spans(found)
    sent = reqpath.Sent(0.0, sent_ns=1 * ms, first_ns=17 * ms, completion_id="cmpl-1")
    # A 1->3, B 3->9 (a migrated request's last route), C 9->10, D 10->14 (the worker 1, its engine's queue
    # 0.5 and prefill 2.5), E 14->17; TTFT 16
    assert reqpath.segments_ms(sent, spans["cmpl-1"]) == pytest.approx((2.0, 6.0, 1.0, 1.0, 0.5, 2.5, 3.0, 16.0))
    assert reqpath.segments_ms(reqpath.Sent(0.0, ms, 17 * ms, "cmpl-2"), spans["cmpl-2"]) is None  # no worker span
    assert reqpath.segments_ms(reqpath.Sent(0.0, ms), spans["cmpl-1"]) is None  # no first chunk
    assert reqpath.summary([(1.0, 2.0), (3.0, 6.0), (5.0, 7.0)]) == ["3.0 / 3.0", "5.0 / 6.0"]


def test_the_slowest_tenth_by_the_clients_ttft_is_told_apart_from_the_rest() -> None:
    reqpath = bench_module("reqpath")
    rows = [(float(i), float(i)) for i in range(20, 0, -1)]  # the client's TTFT is the last field
    tail, rest = reqpath.tail_split(rows)
    assert tail == [(19.0, 19.0), (20.0, 20.0)] and len(rest) == 18 and max(r[-1] for r in rest) == 18.0
    assert reqpath.tail_split([(1.0, 5.0)]) == ([(1.0, 5.0)], [])  # at least one in the tail
    assert reqpath.tail_split([]) == ([], [])
    assert reqpath.means([(1.0, 2.0), (3.0, 6.0)]) == ["2.0", "4.0"]
