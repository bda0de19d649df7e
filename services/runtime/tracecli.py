"""`kvmesh trace`: recent requests and one request's waterfall, from the mesh's JSONL span files.

Each process writes its finished spans to `<trace_dir>/<service>-<host>-<pid>.jsonl` (see
`telemetry.py`); spans of one request share a trace id and link to their parents across
processes. Everything here but `trace_main` is a pure function over parsed spans.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from .telemetry import CLIENT_REQUEST_ID_ATTRIBUTE, REQUEST_ID_ATTRIBUTE

DEFAULT_TRACE_DIR = ".kvmesh/traces"
ORPHAN_MARK = "~"
MIRRORED_REQUEST_ID_ATTRIBUTE = "kvmesh.mirrored_request_id"  # set by the canary on its replays


@dataclass(frozen=True, slots=True)
class Span:
    trace_id: str
    span_id: str
    parent_id: str | None
    name: str
    service: str
    start_ns: int
    end_ns: int
    status: str = "UNSET"
    kind: str = "INTERNAL"
    attributes: dict[str, Any] = field(default_factory=dict)
    events: tuple[tuple[str, int], ...] = ()  # (name, time_ns), as recorded

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns

    @property
    def request_id(self) -> str | None:
        value = self.attributes.get(REQUEST_ID_ATTRIBUTE)
        return str(value) if value not in (None, "") else None

    @classmethod
    def from_record(cls, record: Any) -> Span | None:
        """A span from one JSONL record, or None when the record is not a span."""
        if not isinstance(record, dict):
            return None
        try:
            start = int(record["start_ns"])
            end = int(record["end_ns"]) if record.get("end_ns") is not None else start
            attributes = record.get("attributes") or {}
            events = tuple((str(e["name"]), int(e["time_ns"])) for e in record.get("events") or ()
                           if isinstance(e, dict) and "name" in e and "time_ns" in e)
            return cls(
                trace_id=str(record["trace_id"]).lower(),
                span_id=str(record["span_id"]).lower(),
                parent_id=str(record["parent_id"]).lower() if record.get("parent_id") else None,
                name=str(record.get("name", "")),
                service=str(record.get("service", "")),
                start_ns=start,
                end_ns=max(end, start),
                status=str(record.get("status", "UNSET")),
                kind=str(record.get("kind", "INTERNAL")),
                attributes=attributes if isinstance(attributes, dict) else {},
                events=events,
            )
        except (KeyError, TypeError, ValueError):
            return None


@dataclass(frozen=True, slots=True)
class Row:
    """One waterfall line: a span, its nesting depth, and whether its parent is missing."""

    span: Span
    depth: int
    orphan: bool


@dataclass(frozen=True, slots=True)
class RequestSummary:
    trace_id: str
    request_id: str
    start_ns: int
    duration_ns: int
    status: str
    span_count: int
    services: tuple[str, ...]


# -- loading ------------------------------------------------------------------------------------
def parse_lines(lines: Iterable[str]) -> tuple[list[Span], int]:
    """Spans from JSONL lines, and how many non-empty lines were not spans (e.g. a half-written tail)."""
    spans: list[Span] = []
    bad = 0
    for line in lines:
        if not line.strip():
            continue
        try:
            span = Span.from_record(json.loads(line))
        except json.JSONDecodeError:
            span = None
        if span is None:
            bad += 1
        else:
            spans.append(span)
    return spans, bad


def load_spans(trace_dir: Path) -> tuple[list[Span], int]:
    """Every span in `*.jsonl` under `trace_dir` (recursively)."""
    spans: list[Span] = []
    bad = 0
    for path in sorted(trace_dir.rglob("*.jsonl")):
        with path.open(encoding="utf-8", errors="replace") as lines:
            found, skipped = parse_lines(lines)
        spans += found
        bad += skipped
    return spans, bad


def group_by_trace(spans: Iterable[Span]) -> dict[str, list[Span]]:
    """Spans per trace id, each list in start order, duplicate span ids dropped."""
    traces: dict[str, dict[str, Span]] = {}
    for span in spans:
        traces.setdefault(span.trace_id, {}).setdefault(span.span_id, span)
    return {tid: sorted(by_id.values(), key=lambda s: (s.start_ns, s.name)) for tid, by_id in traces.items()}


# -- trees and summaries ------------------------------------------------------------------------
def build_rows(spans: Sequence[Span]) -> list[Row]:
    """Depth-first display order: roots (and orphans, marked) by start time, children under parents."""
    ids = {s.span_id for s in spans}
    children: dict[str, list[Span]] = {}
    tops: list[Span] = []
    for span in sorted(spans, key=lambda s: (s.start_ns, s.name)):
        if span.parent_id and span.parent_id in ids and span.parent_id != span.span_id:
            children.setdefault(span.parent_id, []).append(span)
        else:
            tops.append(span)
    rows: list[Row] = []
    seen: set[str] = set()

    def visit(span: Span, depth: int, orphan: bool) -> None:
        seen.add(span.span_id)
        rows.append(Row(span, depth, orphan))
        for child in children.get(span.span_id, []):
            if child.span_id not in seen:
                visit(child, depth + 1, False)

    for span in tops:
        visit(span, 0, span.parent_id is not None)
    for span in spans:  # NOTE: only a parent cycle leaves spans unvisited; show them rather than lose them
        if span.span_id not in seen:
            visit(span, 0, True)
    return rows


def _roots(spans: Sequence[Span]) -> list[Span]:
    return [row.span for row in build_rows(spans) if row.depth == 0]


def request_id_of(spans: Sequence[Span]) -> str | None:
    """The request id of a trace: its root's, else the first span's that carries one."""
    for span in [*_roots(spans), *spans]:
        if span.request_id:
            return span.request_id
    return None


def extent_ns(spans: Sequence[Span]) -> tuple[int, int]:
    """(first start, last end) over the spans."""
    return min(s.start_ns for s in spans), max(s.end_ns for s in spans)


def summarize(spans: Sequence[Span]) -> RequestSummary:
    roots = _roots(spans)
    true_roots = [s for s in roots if s.parent_id is None]
    start, end = extent_ns(spans)
    head = true_roots[0] if true_roots else None
    return RequestSummary(
        trace_id=spans[0].trace_id,
        request_id=request_id_of(spans) or "",
        start_ns=head.start_ns if head else start,
        duration_ns=head.duration_ns if head else end - start,
        status="ERROR" if any(s.status == "ERROR" for s in spans) else "OK",
        span_count=len(spans),
        services=tuple(sorted({s.service for s in spans if s.service})),
    )


def list_requests(spans: Iterable[Span], limit: int) -> list[RequestSummary]:
    """The most recent `limit` traces that carry a request id, newest first."""
    summaries = [summarize(t) for t in group_by_trace(spans).values() if request_id_of(t)]
    summaries.sort(key=lambda s: s.start_ns, reverse=True)
    return summaries[:limit]


def _request_ids(span: Span) -> tuple[str, ...]:
    """The request ids a span belongs to: its own, the client's X-Request-Id it carries, and the
    production request a canary replay mirrors."""
    ids = (span.request_id, span.attributes.get(CLIENT_REQUEST_ID_ATTRIBUTE), span.attributes.get(MIRRORED_REQUEST_ID_ATTRIBUTE))
    return tuple(str(i) for i in ids if i)


def find_traces(spans: Iterable[Span], key: str) -> list[list[Span]]:
    """Traces whose id is (or starts with) `key`, else whose spans carry request id `key` (a
    request's canary replays included)."""
    traces = group_by_trace(spans)
    wanted = key.strip().lower()
    by_id = [t for tid, t in traces.items() if tid == wanted or (len(wanted) >= 8 and tid.startswith(wanted))]
    if not by_id:
        by_id = [t for t in traces.values() if any(key.strip() in _request_ids(s) for s in t)]
    return sorted(by_id, key=lambda t: extent_ns(t)[0])


# -- rendering ----------------------------------------------------------------------------------
def _ms(ns: int) -> str:
    return f"{ns / 1e6:.2f}"


def render_list(summaries: Sequence[RequestSummary]) -> list[str]:
    width = max(len("request id"), *(len(s.request_id) for s in summaries))
    header = f"{'time':<23}  {'request id':<{width}}  {'trace id':<32}  {'ms':>9}  {'status':<6}  {'spans':>5}  services"
    lines = [header]
    for s in summaries:
        when = datetime.fromtimestamp(s.start_ns / 1e9).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
        lines.append(
            f"{when:<23}  {s.request_id:<{width}}  {s.trace_id:<32}  {_ms(s.duration_ns):>9}  {s.status:<6}  "
            f"{s.span_count:>5}  {','.join(s.services)}"
        )
    return lines


def _bar(offset: int, duration: int, total: int, width: int, char: str) -> str:
    first = min(width - 1, int(offset * width / total))
    last = max(first + 1, min(width, math.ceil((offset + duration) * width / total)))
    return "|" + " " * first + char * (last - first) + " " * (width - last) + "|"


def _shorten(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def render_waterfall(spans: Sequence[Span], width: int = 40, bar_char: str = "█", verbose: bool = False) -> list[str]:
    """The trace as one line per span: start offset and duration in ms, service, nested name, bar."""
    rows = build_rows(spans)
    start, end = extent_ns(spans)
    total = max(1, end - start)
    summary = summarize(spans)
    names = [("  " * r.depth) + (f"{ORPHAN_MARK} " if r.orphan else "") + r.span.name for r in rows]
    name_width = min(56, max(len("span"), *(len(n) for n in names)))
    service_width = max(len("service"), *(len(r.span.service) for r in rows))
    lines = [
        f"trace {summary.trace_id}  request {summary.request_id or '-'}  {_ms(end - start)} ms  "
        f"{len(spans)} spans  services: {', '.join(summary.services)}",
        f"{'start ms':>10} {'dur ms':>10}  {'service':<{service_width}}  {'span':<{name_width}}  timeline",
    ]
    for row, name in zip(rows, names):
        s = row.span
        bar = _bar(s.start_ns - start, s.duration_ns, total, width, bar_char)
        flag = "  ERROR" if s.status == "ERROR" else ""
        lines.append(
            f"{_ms(s.start_ns - start):>10} {_ms(s.duration_ns):>10}  {s.service:<{service_width}}  "
            f"{_shorten(name, name_width):<{name_width}}  {bar}{flag}"
        )
        if verbose:
            pad = " " * (25 + service_width + 2 * (row.depth + 1))
            lines += [f"{pad}{k}={v}" for k, v in sorted(s.attributes.items())]
    if any(r.orphan for r in rows):
        lines.append(f"{ORPHAN_MARK} = parent span not found (its process wrote no spans here, or has not flushed yet)")
    return lines


# -- command ------------------------------------------------------------------------------------
def _bar_char() -> str:
    encoding = (getattr(sys.stdout, "encoding", None) or "").lower()
    return "█" if "utf" in encoding else "#"


def trace_main(argv: Sequence[str] | None = None) -> int:
    """`kvmesh trace [--dir DIR] [--limit N] [-v] [REQUEST_ID | TRACE_ID]`."""
    p = argparse.ArgumentParser(prog="kvmesh trace", description="List recent requests, or draw one request's trace.")
    p.add_argument("key", nargs="?", help="request id (or trace id, or a trace id prefix of 8+ hex digits)")
    p.add_argument("--dir", default=os.environ.get("KVMESH_TRACE_DIR", DEFAULT_TRACE_DIR),
                   help="trace directory (default: $KVMESH_TRACE_DIR or .kvmesh/traces)")
    p.add_argument("--limit", type=int, default=20, help="requests to list (default 20)")
    p.add_argument("--width", type=int, default=40, help="width of the timeline bars")
    p.add_argument("-v", "--verbose", action="store_true", help="also print span attributes")
    args = p.parse_args(argv)
    trace_dir = Path(args.dir)
    if not trace_dir.is_dir():
        print(f"kvmesh trace: no trace directory {trace_dir} (services write JSONL there when no OTLP "
              "endpoint is set; pick another with --dir or KVMESH_TRACE_DIR)", file=sys.stderr)
        return 1
    spans, bad = load_spans(trace_dir)
    if bad and args.verbose:
        print(f"kvmesh trace: skipped {bad} unreadable line(s)", file=sys.stderr)
    if args.key is None:
        summaries = list_requests(spans, max(1, args.limit))
        if not summaries:
            print(f"kvmesh trace: no requests traced in {trace_dir} yet")
            return 0
        print("\n".join(render_list(summaries)))
        return 0
    traces = find_traces(spans, args.key)
    if not traces:
        print(f"kvmesh trace: no trace with request id or trace id {args.key!r} in {trace_dir}", file=sys.stderr)
        return 1
    blocks = ["\n".join(render_waterfall(t, max(8, args.width), _bar_char(), args.verbose)) for t in traces]
    print("\n\n".join(blocks))
    return 0


if __name__ == "__main__":
    raise SystemExit(trace_main())
