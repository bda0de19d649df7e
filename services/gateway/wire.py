"""Between the gateway's request types and the protobuf messages of the scheduler and decode
workers: sampling out, logprobs and gRPC failures in."""

from __future__ import annotations

import grpc

from kvmesh.runtime.pb import common_pb2

from .errors import ApiError
from .outputs import TokenLogprob
from .protocol import SamplingSpec


def api_error_from_grpc(code: grpc.StatusCode, details: str, retry_after_s: float | None = None) -> ApiError:
    """The HTTP error for a failed scheduler or decode call."""
    details = details or code.name
    if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE):
        return ApiError(400, details)
    if code is grpc.StatusCode.NOT_FOUND:
        return ApiError(404, details, code="not_found")
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED:
        return ApiError(429, details, code="rate_limit_exceeded", retry_after_s=retry_after_s or 1.0)
    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
        return ApiError(504, f"The request timed out ({details}).", code="timeout")
    if code is grpc.StatusCode.UNAVAILABLE:
        return ApiError(503, f"No worker is available to serve this request: {details}", code="service_unavailable")
    return ApiError(503, f"Upstream error {code.name}: {details}", code="upstream_error")


def retry_after_from(trailers: object) -> float | None:
    """The "retry-after" trailer (seconds) of a failed call, when present and numeric."""
    for key, value in trailers or ():
        if key.lower() == "retry-after":
            try:
                return float(value)
            except (TypeError, ValueError):
                return None
    return None


def sampling_pb(spec: SamplingSpec, max_tokens: int) -> common_pb2.SamplingParams:
    pb = common_pb2.SamplingParams(
        temperature=spec.temperature,
        top_p=spec.top_p,
        top_k=spec.top_k,
        max_tokens=max_tokens,
        stop=list(spec.stop),
        stop_token_ids=list(spec.stop_token_ids),
        ignore_eos=spec.ignore_eos,
    )
    if spec.seed is not None:
        pb.seed = spec.seed
    if spec.logprobs is not None:
        pb.logprobs = spec.logprobs
    return pb


def logprobs_from_pb(entries: list[common_pb2.TokenLogprob]) -> list[TokenLogprob] | None:
    if not entries:
        return None
    return [TokenLogprob(e.token_id, e.logprob, tuple((t.token_id, t.logprob) for t in e.top)) for e in entries]
