"""Errors a caller can cause or must handle, each carrying the gRPC status it maps to."""

from __future__ import annotations

import grpc


class MeshError(Exception):
    """Base class: `code` is the gRPC status a server answers with."""

    code = grpc.StatusCode.INTERNAL


class InvalidArgument(MeshError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(MeshError):
    code = grpc.StatusCode.NOT_FOUND


class FailedPrecondition(MeshError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class Unavailable(MeshError):
    code = grpc.StatusCode.UNAVAILABLE


class ResourceExhausted(MeshError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


def status_for(exc: BaseException) -> grpc.StatusCode:
    """The status an exception maps to: MeshError by class, ValueError as INVALID_ARGUMENT, ...,
    NotImplementedError as UNIMPLEMENTED."""
    if isinstance(exc, MeshError):
        return exc.code
    if isinstance(exc, ValueError):
        return grpc.StatusCode.INVALID_ARGUMENT
    if isinstance(exc, KeyError):
        return grpc.StatusCode.NOT_FOUND
    if isinstance(exc, TimeoutError):
        return grpc.StatusCode.DEADLINE_EXCEEDED
    if isinstance(exc, NotImplementedError):  # e.g. a generated servicer's method nobody overrode
        return grpc.StatusCode.UNIMPLEMENTED
    return grpc.StatusCode.INTERNAL
