"""`kvmesh trace`: listing requests and drawing waterfalls from handmade JSONL span files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvmesh.runtime.tracecli import (
    Span,
    build_rows,
    find_traces,
    list_requests,
    load_spans,
    parse_lines,
    render_waterfall,
    summarize,
    trace_main,
)

T1 = "0af7651916cd43dd8448eb211c80319c"
T2 = "1bf7651916cd43dd8448eb211c80319d"
MS = 1_000_000
BASE = 1_700_000_000_000 * MS // 1000  # ns


def rec(trace_id, span_id, parent_id, name, service, start_ms, end_ms, status="UNSET", **attributes):
    return {
        "trace_id": trace_id, "span_id": span_id, "parent_id": parent_id, "name": name, "service": service,
        "kind": "INTERNAL", "start_ns": BASE + start_ms * MS, "end_ns": BASE + end_ms * MS, "status": status,
        "attributes": attributes,
    }


def write(path: Path, records) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


@pytest.fixture
def trace_dir(tmp_path: Path) -> Path:
    """Request req-1 across three processes; req-2 later, with an error and a span whose parent is missing."""
    d = tmp_path / "traces"
    write(d / "gateway-h-1.jsonl", [
        rec(T1, "a" * 16, None, "POST /v1/chat/completions", "gateway", 0, 100, **{"kvmesh.request_id": "req-1"}),
        rec(T2, "d" * 16, None, "POST /v1/chat/completions", "gateway", 1000, 1050, "ERROR",
            **{"kvmesh.request_id": "req-2"}),
    ])
    write(d / "scheduler-h-2.jsonl", [rec(T1, "b" * 16, "a" * 16, "scheduler.route", "scheduler", 2, 5, policy="kv")])
    write(d / "decode-h-3.jsonl", [
        rec(T1, "c" * 16, "a" * 16, "decode.generate", "decode", 6, 98),
        rec(T1, "e" * 16, "c" * 16, "decode.queue_wait", "decode", 7, 9),
        rec(T2, "f" * 16, "9" * 16, "decode.generate", "decode", 1010, 1040),
    ])
    return d


def test_parse_lines_skips_junk_and_half_written_lines() -> None:
    good = json.dumps(rec(T1, "a" * 16, None, "x", "gateway", 0, 1))
    spans, bad = parse_lines([good, "", '{"trace_id": "abc"}', '{"trace_id": "0af7', "[]"])
    assert [s.name for s in spans] == ["x"]
    assert bad == 3


def test_load_spans_reads_every_process_file(trace_dir: Path) -> None:
    spans, bad = load_spans(trace_dir)
    assert bad == 0
    assert sorted({s.service for s in spans}) == ["decode", "gateway", "scheduler"]
    assert len(spans) == 6


def test_rows_nest_children_under_parents_across_processes(trace_dir: Path) -> None:
    spans, _ = load_spans(trace_dir)
    [trace] = find_traces(spans, "req-1")
    rows = build_rows(trace)
    assert [(r.span.name, r.depth, r.orphan) for r in rows] == [
        ("POST /v1/chat/completions", 0, False),
        ("scheduler.route", 1, False),
        ("decode.generate", 1, False),
        ("decode.queue_wait", 2, False),
    ]


def test_span_whose_parent_is_missing_is_a_marked_root(trace_dir: Path) -> None:
    spans, _ = load_spans(trace_dir)
    [trace] = find_traces(spans, "req-2")
    assert [(r.span.name, r.depth, r.orphan) for r in build_rows(trace)] == [
        ("POST /v1/chat/completions", 0, False),
        ("decode.generate", 0, True),
    ]


def test_parent_cycle_does_not_lose_spans() -> None:
    a = Span.from_record(rec(T1, "1" * 16, "2" * 16, "a", "s", 0, 1))
    b = Span.from_record(rec(T1, "2" * 16, "1" * 16, "b", "s", 1, 2))
    assert sorted(r.span.name for r in build_rows([a, b])) == ["a", "b"]


def test_list_requests_newest_first_with_summary(trace_dir: Path) -> None:
    spans, _ = load_spans(trace_dir)
    newest, older = list_requests(spans, limit=10)
    assert (newest.request_id, newest.status, newest.span_count) == ("req-2", "ERROR", 2)
    assert (older.request_id, older.trace_id, older.duration_ns, older.status) == ("req-1", T1, 100 * MS, "OK")
    assert older.services == ("decode", "gateway", "scheduler")
    assert [s.request_id for s in list_requests(spans, limit=1)] == ["req-2"]


def test_traces_without_request_id_are_not_listed() -> None:
    spans = [Span.from_record(rec(T1, "1" * 16, None, "heartbeat", "decode", 0, 1))]
    assert list_requests(spans, limit=10) == []


def test_find_by_trace_id_or_prefix(trace_dir: Path) -> None:
    spans, _ = load_spans(trace_dir)
    assert [t[0].trace_id for t in find_traces(spans, T2)] == [T2]
    assert [t[0].trace_id for t in find_traces(spans, T1[:8].upper())] == [T1]
    assert find_traces(spans, "req-404") == []


def test_summary_duration_is_the_root_span(trace_dir: Path) -> None:
    spans, _ = load_spans(trace_dir)
    [trace] = find_traces(spans, "req-1")
    assert summarize(trace).duration_ns == 100 * MS


def test_waterfall_draws_offsets_durations_and_scaled_bars(trace_dir: Path) -> None:
    spans, _ = load_spans(trace_dir)
    [trace] = find_traces(spans, "req-1")
    lines = render_waterfall(trace, width=10, bar_char="#")
    assert lines[0].startswith(f"trace {T1}  request req-1  100.00 ms  4 spans  services: decode, gateway, scheduler")
    root, route, generate, wait = lines[2:6]
    assert root.split()[:3] == ["0.00", "100.00", "gateway"] and root.endswith("|##########|")
    assert route.split()[:4] == ["2.00", "3.00", "scheduler", "scheduler.route"] and route.endswith("|#         |")
    assert "  decode.generate" in generate and generate.endswith("|##########|")
    assert "    decode.queue_wait" in wait and wait.endswith("|#         |")


def test_waterfall_marks_orphans_and_errors(trace_dir: Path) -> None:
    spans, _ = load_spans(trace_dir)
    [trace] = find_traces(spans, "req-2")
    lines = render_waterfall(trace, width=10, bar_char="#")
    assert lines[2].endswith("ERROR")
    assert "~ decode.generate" in lines[3]
    assert lines[-1].startswith("~ = parent span not found")


def test_waterfall_verbose_prints_attributes(trace_dir: Path) -> None:
    spans, _ = load_spans(trace_dir)
    [trace] = find_traces(spans, "req-1")
    assert any(line.strip() == "policy=kv" for line in render_waterfall(trace, verbose=True))


def test_trace_main_lists_and_draws(trace_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert trace_main(["--dir", str(trace_dir)]) == 0
    listing = capsys.readouterr().out.splitlines()
    assert listing[0].startswith("time")
    assert [line.split()[2] for line in listing[1:]] == ["req-2", "req-1"]

    assert trace_main(["--dir", str(trace_dir), "req-1"]) == 0
    assert "scheduler.route" in capsys.readouterr().out

    assert trace_main(["--dir", str(trace_dir), "nope"]) == 1
    assert "no trace" in capsys.readouterr().err


def test_trace_main_reads_dir_from_env(trace_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setenv("KVMESH_TRACE_DIR", str(trace_dir))
    assert trace_main(["--limit", "1"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2


def test_trace_main_without_directory_fails_clearly(tmp_path: Path, capsys) -> None:
    assert trace_main(["--dir", str(tmp_path / "missing")]) == 1
    assert "no trace directory" in capsys.readouterr().err


def test_request_id_also_finds_its_canary_replays(trace_dir: Path) -> None:
    replay = rec("2" * 32, "7" * 16, None, "canary.replay", "canary", 2000, 2010,
                 **{"kvmesh.request_id": "canary-req-1", "kvmesh.mirrored_request_id": "req-1"})
    write(trace_dir / "canary-h-4.jsonl", [replay])
    spans, _ = load_spans(trace_dir)
    assert [t[0].trace_id for t in find_traces(spans, "req-1")] == [T1, "2" * 32]
    assert [t[0].trace_id for t in find_traces(spans, "canary-req-1")] == ["2" * 32]
