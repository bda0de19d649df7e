"""Deliberately broken implementations: a gRPC proxy in front of one of our services that breaks
exactly one rule (rewrites one request or reply), so a suite must fail exactly that clause."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf import descriptor_pool, message_factory

import kvmesh.runtime.pb.canary_pb2  # noqa: F401 - registers the descriptors the proxy looks up
import kvmesh.runtime.pb.decode_pb2  # noqa: F401
import kvmesh.runtime.pb.kvstore_pb2  # noqa: F401
import kvmesh.runtime.pb.prefill_pb2  # noqa: F401
import kvmesh.runtime.pb.scheduler_pb2  # noqa: F401
from grpc_health.v1 import health_pb2  # noqa: F401

Rewrite = Callable[[Any], Any]


@dataclass
class Breaker(grpc.GenericRpcHandler):
    """Forwards every call to `target`; `requests`/`replies` rewrite messages of one method
    ("Service/Method", e.g. "KvStore/Put"); a rewrite returning None drops the message. Unary
    methods in `detached` are forwarded without the caller's deadline and go on upstream when the
    caller gives up (a server that forgets a request's deadline and cancellation). Methods in
    `absent` are not served (UNIMPLEMENTED: an implementation older than them)."""

    target: str
    requests: dict[str, Rewrite] = field(default_factory=dict)
    replies: dict[str, Rewrite] = field(default_factory=dict)
    detached: frozenset[str] = frozenset()
    absent: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        self.channel = grpc.aio.insecure_channel(self.target)
        self.orphans: set[asyncio.Future] = set()   # detached upstream calls still running

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        full = details.method.lstrip("/")                       # "kvmesh.v1.KvStore/Put"
        service, method = full.split("/")
        desc = descriptor_pool.Default().FindServiceByName(service).FindMethodByName(method)
        req_cls = message_factory.GetMessageClass(desc.input_type)
        rep_cls = message_factory.GetMessageClass(desc.output_type)
        key = f"{service.rsplit('.', 1)[-1]}/{method}"
        if key in self.absent:
            return None
        fix_req = self.requests.get(key, lambda m: m)
        fix_rep = self.replies.get(key, lambda m: m)
        path, ser, de = details.method, req_cls.SerializeToString, rep_cls.FromString

        async def requests_of(iterator):  # noqa: ANN001, ANN202
            async for msg in iterator:
                if (msg := fix_req(msg)) is not None:
                    yield msg

        if desc.client_streaming and desc.server_streaming:
            return None
        if desc.server_streaming:
            async def unary_stream(request, context):  # noqa: ANN001, ANN202
                call = self.channel.unary_stream(path, ser, de)(fix_req(request), timeout=context.time_remaining())
                try:
                    async for reply in call:
                        if (reply := fix_rep(reply)) is not None:
                            yield reply
                except grpc.aio.AioRpcError as exc:
                    await context.abort(exc.code(), exc.details())
            return grpc.unary_stream_rpc_method_handler(unary_stream, req_cls.FromString, rep_cls.SerializeToString)
        if desc.client_streaming:
            async def stream_unary(iterator, context):  # noqa: ANN001, ANN202
                call = self.channel.stream_unary(path, ser, de)(requests_of(iterator), timeout=context.time_remaining())
                return fix_rep(await _upstream(call, context))
            return grpc.stream_unary_rpc_method_handler(stream_unary, req_cls.FromString, rep_cls.SerializeToString)

        async def unary_unary(request, context):  # noqa: ANN001, ANN202
            if key in self.detached:
                upstream = asyncio.ensure_future(self.channel.unary_unary(path, ser, de)(fix_req(request), timeout=60))
                self.orphans.add(upstream)
                upstream.add_done_callback(self.orphans.discard)
                return fix_rep(await _upstream(asyncio.shield(upstream), context))
            call = self.channel.unary_unary(path, ser, de)(fix_req(request), timeout=context.time_remaining())
            return fix_rep(await _upstream(call, context))
        return grpc.unary_unary_rpc_method_handler(unary_unary, req_cls.FromString, rep_cls.SerializeToString)


async def _upstream(call: Any, context: grpc.aio.ServicerContext) -> Any:
    """The upstream reply; an upstream error is passed on with its own status and trailers."""
    try:
        return await call
    except grpc.aio.AioRpcError as exc:
        await context.abort(exc.code(), exc.details(), tuple(exc.trailing_metadata() or ()))


async def start_breaker(breaker: Breaker) -> tuple[grpc.aio.Server, str]:
    """Serves `breaker` on a free loopback port; returns the server and its endpoint."""
    server = grpc.aio.server()
    server.add_generic_rpc_handlers([breaker])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


def changed(message: Any, **fields: Any) -> Any:
    """A copy of `message` with `fields` set."""
    out = type(message)()
    out.CopyFrom(message)
    for name, value in fields.items():
        if isinstance(value, list):
            out.ClearField(name)
            getattr(out, name).extend(value)
        else:
            setattr(out, name, value)
    return out
