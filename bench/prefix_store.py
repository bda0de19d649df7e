"""KV store throughput: Put/Get over loopback gRPC vs raw loopback TCP moving the same bytes.

    .venv/bin/python bench/prefix_store.py [--blocks 32] [--rounds 3] [--layers 32] [--heads 8] [--head-dim 128]

Starts the kvstore in-process on 127.0.0.1:0 and an asyncio TCP echo-sink beside it (same
process, same event loop, same machine), then moves the same blocks both ways: a gRPC Put of N
blocks (two-phase, validated, stored) against N length-prefixed writes on a raw socket; a gRPC
Get of N blocks against N reads. Best of interleaved rounds; prints MB/s for each and the ratio
(goal: gRPC >= 50% of raw TCP), plus a block's bytes raw vs int8. Bounded to well under a minute.
"""

from __future__ import annotations

import argparse
import asyncio
import struct
import time

import grpc
import numpy as np


from prometheus_client import CollectorRegistry

from kvmesh.kvstore import codec
from kvmesh.kvstore.blocks import Encoding, ModelSpec, make_block
from kvmesh.kvstore.config import KvStoreSettings
from kvmesh.kvstore.main import start
from kvmesh.kvstore.metrics import StoreMetrics
from kvmesh.kvstore.server import block_to_pb
from kvmesh.runtime import kvwire
from kvmesh.runtime.grpcutil import CHANNEL_OPTIONS
from kvmesh.runtime.pb import common_pb2, kvstore_pb2, kvstore_pb2_grpc

_LEN = struct.Struct("<Q")
MB = 1e6


def payloads(spec: ModelSpec, count: int = 4) -> list[bytes]:
    rng = np.random.default_rng(0)
    out = []
    for _ in range(count):
        x = rng.standard_normal(spec.numel, dtype=np.float32)
        out.append(kvwire.from_float32(x, spec.dtype))
    return out


def put_messages(spec_pb, blocks) -> list[kvstore_pb2.PutMessage]:
    msgs = [kvstore_pb2.PutMessage(open=kvstore_pb2.PutOpen(spec=spec_pb, producer_id="bench"))]
    msgs += [kvstore_pb2.PutMessage(block=b) for b in blocks]
    msgs.append(kvstore_pb2.PutMessage(commit=kvstore_pb2.PutCommit(num_blocks=len(blocks))))
    return msgs


class TcpSink:
    """Raw loopback baseline: 'P' + length-prefixed frames (ends with 0) → 1-byte ack; 'G' n → n frames."""

    def __init__(self, frame: bytes) -> None:
        self.frame = frame

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while op := await reader.read(1):
            if op == b"P":
                while (n := _LEN.unpack(await reader.readexactly(_LEN.size))[0]) > 0:
                    await reader.readexactly(n)
                writer.write(b"k")
            else:
                (count,) = _LEN.unpack(await reader.readexactly(_LEN.size))
                for _ in range(count):
                    writer.write(_LEN.pack(len(self.frame)))
                    writer.write(self.frame)
                    await writer.drain()
            await writer.drain()
        writer.close()


async def tcp_put(reader, writer, frames: list[bytes]) -> None:
    writer.write(b"P")
    for f in frames:
        writer.write(_LEN.pack(len(f)))
        writer.write(f)
        await writer.drain()
    writer.write(_LEN.pack(0))
    await writer.drain()
    await reader.readexactly(1)


async def tcp_get(reader, writer, count: int) -> int:
    writer.write(b"G" + _LEN.pack(count))
    await writer.drain()
    total = 0
    for _ in range(count):
        (n,) = _LEN.unpack(await reader.readexactly(_LEN.size))
        total += len(await reader.readexactly(n))
    return total


async def run(args: argparse.Namespace) -> None:
    spec = ModelSpec("bench", args.dtype, 16, args.layers, args.heads, args.head_dim)
    spec_pb = common_pb2.ModelSpec(model_id=spec.model_id, dtype=spec.dtype, block_size=16,
                                   num_layers=spec.num_layers, num_kv_heads=spec.num_kv_heads, head_dim=spec.head_dim)
    datas = payloads(spec)
    block_bytes = spec.raw_block_bytes
    settings = KvStoreSettings(host="127.0.0.1", port=0, metrics_port=-1, nats=False, block_size=16,
                               memory_bytes=(args.blocks * 3 + 8) * block_bytes, store_id="bench")
    running = await start(settings, StoreMetrics(CollectorRegistry()))
    channel = grpc.aio.insecure_channel(running.endpoint, options=CHANNEL_OPTIONS)
    stub = kvstore_pb2_grpc.KvStoreStub(channel)
    # NOTE: stream buffers sized to a block, so the baseline is not throttled by 64 KiB defaults.
    limit = 2 * block_bytes
    sink = await asyncio.start_server(TcpSink(datas[0]).handle, "127.0.0.1", 0, limit=limit)
    reader, writer = await asyncio.open_connection("127.0.0.1", sink.sockets[0].getsockname()[1], limit=limit)
    writer.transport.set_write_buffer_limits(high=limit)
    total = args.blocks * block_bytes
    best = {"grpc_put": 0.0, "grpc_get": 0.0, "tcp_put": 0.0, "tcp_get": 0.0, "grpc_get_int8": 0.0}
    int8_wire = 0
    try:
        for r in range(args.rounds):
            blocks = [block_to_pb(make_block(spec, f"r{r}b{i}".encode().ljust(32, b"\0"), i, datas[i % len(datas)]))
                      for i in range(args.blocks)]
            messages = put_messages(spec_pb, blocks)
            hashes = [b.header.block_hash for b in blocks]

            t = time.perf_counter()
            reply = await stub.Put(iter(messages), timeout=60)
            best["grpc_put"] = max(best["grpc_put"], total / (time.perf_counter() - t) / MB)
            assert reply.stored == args.blocks, reply

            t = time.perf_counter()
            await tcp_put(reader, writer, [b.data for b in blocks])
            best["tcp_put"] = max(best["tcp_put"], total / (time.perf_counter() - t) / MB)

            request = kvstore_pb2.GetRequest(spec=spec_pb, block_hashes=hashes, encoding=common_pb2.KV_ENCODING_RAW)
            t = time.perf_counter()
            got = sum([len(b.data) async for b in stub.Get(request, timeout=60)])
            best["grpc_get"] = max(best["grpc_get"], got / (time.perf_counter() - t) / MB)

            t = time.perf_counter()
            got = await tcp_get(reader, writer, args.blocks)
            best["tcp_get"] = max(best["tcp_get"], got / (time.perf_counter() - t) / MB)

            request.encoding = common_pb2.KV_ENCODING_INT8
            t = time.perf_counter()
            int8_wire = sum([len(b.data) + len(b.scales) async for b in stub.Get(request, timeout=60)])
            best["grpc_get_int8"] = max(best["grpc_get_int8"], total / (time.perf_counter() - t) / MB)
    finally:
        writer.close()
        sink.close()
        await channel.close()
        await running.stop()

    int8 = codec.convert(make_block(spec, b"x" * 32, 0, datas[0]), Encoding.INT8)
    print(f"block: {spec.block_shape} {spec.dtype}, {block_bytes / MB:.2f} MB raw; "
          f"{args.blocks} blocks x {args.rounds} rounds ({total / MB:.0f} MB per call), best round")
    print(f"  Put  gRPC {best['grpc_put']:8.0f} MB/s   raw TCP {best['tcp_put']:8.0f} MB/s   "
          f"ratio {best['grpc_put'] / best['tcp_put']:.0%}")
    print(f"  Get  gRPC {best['grpc_get']:8.0f} MB/s   raw TCP {best['tcp_get']:8.0f} MB/s   "
          f"ratio {best['grpc_get'] / best['tcp_get']:.0%}")
    print(f"  Get int8 (quantized on the fly): {best['grpc_get_int8']:.0f} MB/s of raw-equivalent KV")
    print(f"  bytes per block: raw {block_bytes}, int8 {int8.nbytes} (data {len(int8.data)} + scales "
          f"{len(int8.scales)}) = {int8.nbytes / block_bytes:.1%}; {int8_wire} int8 bytes sent per Get")
    goal = min(best["grpc_put"] / best["tcp_put"], best["grpc_get"] / best["tcp_get"]) >= 0.5
    print(f"  goal (gRPC >= 50% of raw TCP both ways): {'met' if goal else 'NOT met'}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--dtype", default="bfloat16")
    return parser.parse_args(argv)


def main() -> None:
    asyncio.run(run(parse_args()))


if __name__ == "__main__":
    main()
