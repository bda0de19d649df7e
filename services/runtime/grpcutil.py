"""gRPC helpers: a server with the standard health service and an exception-mapping interceptor,
and client channels whose every call carries a deadline."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from .errors import InvalidArgument, ResourceExhausted, status_for
from .process import freeze_startup_objects

log = logging.getLogger(__name__)

# NOTE: KV blocks travel one per message, far below this; the limit is raised on both ends so a
# large model's block (or an int8 block with scales) never trips gRPC's 4 MiB default.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.keepalive_permit_without_calls", 1),
]
# NOTE: gRPC turns SO_REUSEPORT on by default on Linux: a second server on a taken port then
# starts fine and the kernel splits connections between the two (seen as UNIMPLEMENTED calls
# when two services raced for one free port). A port belongs to one server here.
SERVER_OPTIONS = [*CHANNEL_OPTIONS, ("grpc.so_reuseport", 0)]
DEFAULT_DEADLINE_S = 30.0
DRAIN_S = 2.0  # how long a failed client-streaming call reads on before it answers (see `_drain`)


# A bidi stream's two ends agree to pack several frames into one (docs/contracts.md, "The Routes
# stream"): each side that can read packed frames says so in its metadata (the client in the
# call's, the server in its initial metadata) and is then sent them.
BATCH_METADATA = ("kvmesh-batch", "1")


def unpacked(frame: Any) -> Sequence[Any]:
    """The frames a stream frame stands for: a `batch` frame's own (in order), else itself.
    A batch inside a batch is InvalidArgument."""
    if frame.WhichOneof("msg") != "batch":
        return (frame,)
    frames = frame.batch.frames
    if any(f.WhichOneof("msg") == "batch" for f in frames):
        raise InvalidArgument("a batch frame inside a batch frame")
    return frames


async def take_ready(queue: asyncio.Queue) -> list[Any]:
    """What a stream's writer sends next: the first item to arrive and everything queued behind
    it, up to and including None (the end of the stream)."""
    ready = [await queue.get()]
    while ready[-1] is not None and not queue.empty():
        ready.append(queue.get_nowait())
    return ready


def peer_batches(metadata) -> bool:  # noqa: ANN001 - grpc.aio.Metadata or a sequence of pairs
    """True when `metadata` says its sender reads packed frames."""
    return any(tuple(item) == BATCH_METADATA for item in metadata or ())


def error_status(exc: BaseException, log_unexpected: bool = True) -> tuple[grpc.StatusCode, str]:
    """The status and message a call that raised `exc` answers with (an unexpected error answers
    INTERNAL without its text, and is logged unless the caller logged it already)."""
    code = status_for(exc)
    if code is grpc.StatusCode.INTERNAL:
        if log_unexpected:
            log.exception("unexpected error in handler", exc_info=exc)
        return code, f"internal error: {type(exc).__name__}"
    return code, str(exc) or type(exc).__name__


async def _abort(context: grpc.aio.ServicerContext, exc: BaseException) -> None:
    if isinstance(exc, ResourceExhausted):
        context.set_trailing_metadata((("retry-after", f"{exc.retry_after_s:g}"),))
    code, message = error_status(exc)
    await context.abort(code, message)


class MalformedRequest:
    """Stands in for a request whose bytes did not parse, so the handler can answer INVALID_ARGUMENT."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


def _safe_deserializer(deserialize: Callable | None) -> Callable | None:
    if deserialize is None:
        return None

    def parse(data: bytes) -> Any:
        try:
            return deserialize(data)
        except Exception as exc:  # noqa: BLE001 - any parse failure is the caller's bad input
            return MalformedRequest(exc)

    return parse


def _checked(request: Any) -> Any:
    if isinstance(request, MalformedRequest):
        raise _malformed(request.error)
    return request


def _malformed(error: Exception) -> InvalidArgument:
    return InvalidArgument(f"malformed request message: {type(error).__name__}")


def parse_request(message_type: Any, data: bytes) -> Any:
    """A request's bytes (a `RAW_REQUESTS` method's) parsed as `message_type`; bytes that do not
    parse are InvalidArgument, as gRPC's own parse of a request would answer."""
    try:
        return message_type.FromString(data)
    except Exception as exc:  # noqa: BLE001 - any parse failure is the caller's bad input
        raise _malformed(exc) from None


async def _checked_stream(requests: Any) -> Any:
    async for request in requests:
        yield _checked(request)


def _check_input(request_or_iterator: Any) -> Any:
    if hasattr(request_or_iterator, "__aiter__"):
        return _checked_stream(request_or_iterator)
    return _checked(request_or_iterator)


def _wrap_unary(behavior: Callable) -> Callable:
    async def handler(request_or_iterator: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await behavior(_check_input(request_or_iterator), context)
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except Exception as exc:  # noqa: BLE001 - mapped to a status code
            await _abort(context, exc)

    return handler


async def _drain(requests: Any, timeout_s: float = DRAIN_S) -> None:
    """Reads (and drops) what is left of a client stream, for at most `timeout_s`.

    NOTE: a bidirectional call that ends with an error while the client is still sending (e.g.
    a malformed frame, then more frames) made gRPC core reset the stream, and the client saw
    INTERNAL "Internal error from Core" instead of the status, depending on timing. Letting the
    client finish sending first (bounded) delivers the real status."""
    async def drop() -> None:
        async for _ in requests:
            pass

    try:
        await asyncio.wait_for(drop(), timeout_s)
    except Exception:  # noqa: BLE001 - the status that follows is what matters
        pass


def _wrap_stream(behavior: Callable) -> Callable:
    async def handler(request_or_iterator: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            async for item in behavior(_check_input(request_or_iterator), context):
                yield item
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except Exception as exc:  # noqa: BLE001 - mapped to a status code
            # NOTE: a method nobody implemented (the generated servicer's default raises
            # NotImplementedError) answers UNIMPLEMENTED at once: drained, a peer that keeps its stream
            # open (the gateway's Routes stream) waited DRAIN_S for it, so against a scheduler without
            # the stream every gateway's first route took 2 s; the gateway takes gRPC core's INTERNAL
            # race for UNIMPLEMENTED before any frame (routestream._unimplemented)
            if hasattr(request_or_iterator, "__aiter__") and not isinstance(exc, NotImplementedError):
                await _drain(request_or_iterator)
            await _abort(context, exc)

    return handler


class ErrorMappingInterceptor(grpc.aio.ServerInterceptor):
    """Turns exceptions raised by servicers into status codes (see `errors.status_for`).

    It also rebuilds every handler's (de)serializers:
    - an answer that is `bytes` goes out as it is: a servicer may serialize a large message
      itself, off the event loop (`pbframe`; the KV store's Get);
    - the methods in `raw_requests` (full names, "/package.Service/Method") get their requests'
      bytes unparsed, to parse off the event loop (a decode worker's PushKv)."""

    def __init__(self, raw_requests: Iterable[str] = ()) -> None:
        self.raw_requests = frozenset(raw_requests)

    async def intercept_service(self, continuation: Callable, handler_call_details: Any) -> Any:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        raw = handler_call_details.method in self.raw_requests
        parse = None if raw else _safe_deserializer(handler.request_deserializer)
        serialize = _passing_bytes(handler.response_serializer)
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(_wrap_unary(handler.unary_unary), parse, serialize)
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(_wrap_stream(handler.unary_stream), parse, serialize)
        if handler.stream_unary:
            return grpc.stream_unary_rpc_method_handler(_wrap_unary(handler.stream_unary), parse, serialize)
        return grpc.stream_stream_rpc_method_handler(_wrap_stream(handler.stream_stream), parse, serialize)


def _passing_bytes(serialize: Callable | None) -> Callable | None:
    if serialize is None:
        return None

    def serializer(message: Any) -> bytes:
        return message if type(message) is bytes else serialize(message)

    return serializer


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """Mutual TLS for gRPC: servers require a client certificate signed by `ca`."""

    cert: bytes
    key: bytes
    ca: bytes

    @classmethod
    def from_settings(cls, settings: Any) -> TlsConfig | None:
        """None when the mesh runs in plaintext (no `tls_cert` configured)."""
        if not settings.tls_cert:
            return None
        paths = (settings.tls_cert, settings.tls_key, settings.tls_ca)
        if not all(paths):
            raise ValueError("TLS needs all of KVMESH_TLS_CERT, KVMESH_TLS_KEY and KVMESH_TLS_CA")
        cert, key, ca = (open(p, "rb").read() for p in paths)  # noqa: SIM115 - tiny files
        return cls(cert, key, ca)

    def server_credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials([(self.key, self.cert)], root_certificates=self.ca, require_client_auth=True)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(root_certificates=self.ca, private_key=self.key, certificate_chain=self.cert)


@dataclass(slots=True)
class GrpcServer:
    """A started server: `port` is the bound port (useful with port 0)."""

    server: grpc.aio.Server
    port: int
    health: health.aio.HealthServicer
    service_names: list[str] = field(default_factory=list)

    async def set_serving(self, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        if serving:
            freeze_startup_objects()
        for name in [""] + self.service_names:
            await self.health.set(name, status)

    async def stop(self, grace_s: float) -> None:
        await self.server.stop(grace_s)


async def start_server(
    host: str,
    port: int,
    register: Iterable[tuple[Callable[[Any, grpc.aio.Server], None], Any, str]],
    interceptors: Iterable[grpc.aio.ServerInterceptor] = (),
    tls: TlsConfig | None = None,
    serving: bool = True,
) -> GrpcServer:
    """Starts a gRPC server on host:port serving each (add_fn, servicer, full service name)
    plus grpc.health.v1 (SERVING once started, or NOT_SERVING until `set_serving(True)` when
    `serving` is False); with `tls`, only clients holding a certificate signed by the mesh CA get in.
    A servicer's `RAW_REQUESTS` (method names) get their requests as bytes (ErrorMappingInterceptor)."""
    register = list(register)
    raw = [f"/{name}/{method}" for _, servicer, name in register for method in getattr(servicer, "RAW_REQUESTS", ())]
    server = grpc.aio.server(interceptors=[*interceptors, ErrorMappingInterceptor(raw)], options=SERVER_OPTIONS)
    names = []
    for add_fn, servicer, name in register:
        add_fn(servicer, server)
        names.append(name)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    started = GrpcServer(server, 0, health_servicer, names)
    await started.set_serving(False)  # until started (and, with `serving` False, until the caller says)
    address = f"{host}:{port}"
    try:
        bound = server.add_secure_port(address, tls.server_credentials()) if tls else server.add_insecure_port(address)
    except RuntimeError as exc:  # grpcio ≥ 1.5x raises instead of returning 0
        raise OSError(f"cannot bind gRPC server to {host}:{port}: {exc}") from exc
    if bound == 0:
        raise OSError(f"cannot bind gRPC server to {host}:{port}")
    await server.start()
    started.port = bound
    if serving:
        await started.set_serving(True)
    return started


class ChannelPool:
    """One aio channel per endpoint, created on first use, closed together."""

    def __init__(self, interceptors: Iterable[grpc.aio.ClientInterceptor] = (), tls: TlsConfig | None = None) -> None:
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._interceptors = list(interceptors)
        self._tls = tls

    def get(self, endpoint: str) -> grpc.aio.Channel:
        channel = self._channels.get(endpoint)
        if channel is None:
            channel = open_channel(endpoint, self._tls, self._interceptors)
            self._channels[endpoint] = channel
        return channel

    async def discard(self, endpoint: str) -> None:
        channel = self._channels.pop(endpoint, None)
        if channel is not None:
            await channel.close()

    async def close(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        await asyncio.gather(*(c.close() for c in channels), return_exceptions=True)


def open_channel(
    endpoint: str, tls: TlsConfig | None = None, interceptors: Iterable[grpc.aio.ClientInterceptor] = ()
) -> grpc.aio.Channel:
    if tls:
        return grpc.aio.secure_channel(endpoint, tls.channel_credentials(), options=CHANNEL_OPTIONS,
                                       interceptors=list(interceptors))
    return grpc.aio.insecure_channel(endpoint, options=CHANNEL_OPTIONS, interceptors=list(interceptors))


async def check_health(endpoint: str, timeout_s: float = 2.0, service: str = "", tls: TlsConfig | None = None) -> bool:
    """True when the server at `endpoint` answers SERVING."""
    async with open_channel(endpoint, tls) as channel:
        try:
            reply = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout_s
            )
        except grpc.aio.AioRpcError:
            return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def advertised_endpoint(host: str, advertise_host: str, port: int) -> str:
    """The host:port peers should dial. An empty `advertise_host` means `host`, except that a
    wildcard bind (0.0.0.0 / ::) advertises this machine's own address (a container's, in compose)."""
    if not advertise_host and host in ("0.0.0.0", "::", ""):
        advertise_host = socket.gethostbyname(socket.gethostname())
    return f"{advertise_host or host}:{port}"
