"""Decode worker metrics (names per dashboards/METRICS.md)."""

from __future__ import annotations

from opentelemetry.trace import Span
from prometheus_client import Counter, Gauge, Histogram

from kvmesh.engine.outputs import RequestOutput
from kvmesh.runtime.metrics import LATENCY_BUCKETS

REQUESTS = Counter("kvmesh_decode_requests", "finished Generate calls", ["status"])
RUNNING = Gauge("kvmesh_decode_running_requests", "running batch size")
WAITING = Gauge("kvmesh_decode_waiting_requests", "queued in the engine")
KV_BLOCKS_USED = Gauge("kvmesh_decode_kv_blocks_used", "paged KV cache blocks in use")
KV_BLOCKS_FREE = Gauge("kvmesh_decode_kv_blocks_free", "free paged KV cache blocks")
PREFIX_QUERY_TOKENS = Counter("kvmesh_decode_prefix_query_tokens", "prompt tokens looked up in the local prefix cache")
PREFIX_HIT_TOKENS = Counter("kvmesh_decode_prefix_hit_tokens", "prompt tokens found in the local prefix cache")
KV_BLOCKS_RECEIVED = Counter("kvmesh_decode_kv_blocks_received", "KV blocks pushed in by prefill workers", ["encoding"])
KV_BYTES_RECEIVED = Counter("kvmesh_decode_kv_bytes_received", "KV bytes pushed in (on the wire)", ["encoding"])
REMOTE_PREFILLS = Counter("kvmesh_decode_remote_prefill_requests", "requests whose prompt KV came from a prefill worker")
LOCAL_PREFILLS = Counter("kvmesh_decode_local_prefill_requests", "requests prefilled on this worker")
STREAM_FRAMES = Counter("kvmesh_decode_stream_frames", "frames read on token streams by kind: generate, abort, or batch (several in one)", ["kind"])
GENERATED_TOKENS = Counter("kvmesh_decode_generated_tokens", "tokens generated")
STREAM_MESSAGES = Counter("kvmesh_decode_stream_messages", "StepOutput messages sent on token streams")
ENGINE_STEPS = Counter("kvmesh_decode_engine_steps", "engine steps run (generated tokens / steps = the mean batch)")
# By step kind (engine/batchstats.py): "decode" steps only decode, "prefill" steps prefill too.
MODEL_STEPS = Counter("kvmesh_decode_model_steps", "engine steps that ran the model, by kind", ["kind"])
STEP_DECODE_ROWS = Counter("kvmesh_decode_step_decode_rows", "decode rows over those steps (/ model_steps = the mean decode batch)", ["kind"])
STEP_PADDED_KV_TOKENS = Counter("kvmesh_decode_step_padded_kv_tokens",
                                "KV tokens those steps' decode attention read: each step's decode rows × its longest context", ["kind"])
ENGINE_BUSY = Counter("kvmesh_decode_engine_busy_seconds", "wall time of those steps (its rate: the engine's busy fraction)", ["kind"])
ENGINE_STEP_CPU = Counter("kvmesh_decode_engine_step_cpu_seconds",
                          "CPU time of the thread that ran those steps (on CUDA: the host's side of each step)", ["kind"])
ENGINE_BETWEEN = Counter("kvmesh_decode_engine_between_steps_seconds",
                         "time the engine had unfinished sequences and was not in a step (its loop's commands, the GIL)")
ENGINE_QUEUE = Histogram("kvmesh_decode_engine_queue_seconds", "a request's add to the engine -> the first step that ran it",
                         buckets=LATENCY_BUCKETS)
ENGINE_PREFILL = Histogram("kvmesh_decode_engine_prefill_seconds", "that step's start -> the request's first token (its prefill)",
                           buckets=LATENCY_BUCKETS)
QUEUE_WAIT = Histogram("kvmesh_decode_queue_wait_seconds", "Generate received -> first engine step", buckets=LATENCY_BUCKETS)
TTFT = Histogram("kvmesh_decode_ttft_seconds", "Generate received -> first token", buckets=LATENCY_BUCKETS)
HANDBACK_BLOCKS = Counter("kvmesh_decode_kv_handback_blocks", "blocks handed to the KV store on finish")


def observe_engine_times(out: RequestOutput, span: Span) -> None:
    """A request's wait in the engine and its prefill (RequestOutput.queue_s / prefill_s, on the
    output with its first token): the histograms and its decode.generate span."""
    if out.queue_s is None or out.prefill_s is None:
        return
    ENGINE_QUEUE.observe(out.queue_s)
    ENGINE_PREFILL.observe(out.prefill_s)
    span.set_attribute("engine_queue_s", out.queue_s)
    span.set_attribute("engine_prefill_s", out.prefill_s)
