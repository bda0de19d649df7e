"""What moving one KV block costs in CPU before gRPC, by the old path (protobuf messages) and by
frames (`kvmesh.runtime.pbframe`), side by side, for three block sizes:

- `tiny` (8 KiB), the ~22M model of bench/mesh.py (128 KiB), an 8B-class model (2 MiB: 32
  layers, 8 KV heads of 128, bfloat16, 16 tokens);
- a prefill worker's PushKv send: the codec pool's work and the event loop's (the old path's
  serializer ran on the loop, as gRPC's request serializer);
- a decode worker's PushKv receive: the event loop's (the parse, each read of the payload, the
  copy into the prompt's buffer) and the codec pool's (validation, checksum, decoding; frames:
  the parse and the copy too);
- the KV store's Get answer: the store thread's and the event loop's;
- a Get's answer read by a worker (`StoreReader`): the event loop's (the parse; frames: the
  header only) and the codec pool's (decoding; frames: the parse too);
- the KV store's Put receive (a hand-back's `runs` message of 4 MiB or one run): the event
  loop's (the parse, the payload's length) and the store thread's (the payload read to stage it).

Thread CPU per block, the median of `--repeats` passes over `--blocks` blocks. Run:
`.venv/bin/python bench/kvframes.py`.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from kvmesh.decode.receive import PendingKv, read_push
from kvmesh.kvstore import codec
from kvmesh.kvstore.blocks import Encoding
from kvmesh.kvstore.server import block_frame, block_from_pb, block_to_pb, parse_put, put_kind
from kvmesh.runtime import kvwire, pbframe
from kvmesh.runtime.kvstoremsgs import PUT_MESSAGE_BYTES, BlockRun, runs_frame
from kvmesh.runtime.pb import common_pb2, decode_pb2, kvstore_pb2
from kvmesh.worker import kvtensor

SIZES = {  # name -> (layers, kv heads, head dim, dtype)
    "tiny 8 KiB": (2, 2, 16, torch.float32),
    "~22M 128 KiB": (8, 2, 64, torch.float32),
    "8B-class 2 MiB": (32, 8, 128, torch.bfloat16),
}
BLOCK_SIZE = 16
HASH = bytes(range(32))
BLOCK_IN_PUSH = pbframe.key(2)


def cpu_us(fn: Callable[[], object], n: int, repeats: int) -> float:
    """Median thread CPU of `fn` over `repeats` passes of `n` calls, µs a call."""
    runs = []
    for _ in range(repeats):
        start = time.thread_time()
        for _ in range(n):
            fn()
        runs.append((time.thread_time() - start) / n * 1e6)
    return statistics.median(runs)


def measure(layers: int, heads: int, dim: int, dtype: torch.dtype, n: int, repeats: int) -> dict[str, float]:
    kv = torch.randn(2, layers, BLOCK_SIZE, heads, dim).to(dtype)
    spec = common_pb2.ModelSpec(model_id="m", dtype=str(dtype).removeprefix("torch."), block_size=BLOCK_SIZE,
                                num_layers=layers, num_kv_heads=heads, head_dim=dim)
    old_block = kvtensor.encode_block(kv, block_hash=HASH)
    old_bytes = decode_pb2.KvPushMessage(block=old_block).SerializeToString()
    new_bytes, _ = kvtensor.encode_frame(kv, block_hash=HASH, wrap=BLOCK_IN_PUSH)
    assert decode_pb2.KvPushMessage.FromString(new_bytes) == decode_pb2.KvPushMessage.FromString(old_bytes)

    pending = PendingKv("bench", BLOCK_SIZE, 0, BLOCK_SIZE, [HASH])
    pending.open(decode_pb2.KvPushOpen(spec=spec, num_tokens=BLOCK_SIZE))
    decoded = kvtensor.decode_block(old_block, spec)

    def old_receive_loop() -> None:  # gRPC's parse, wire_bytes twice (each read of `data` copies), the copy into place
        msg = decode_pb2.KvPushMessage.FromString(old_bytes)
        len(msg.block.data) + len(msg.block.scales)
        len(msg.block.data) + len(msg.block.scales)
        pending.kv[:, :, 0:BLOCK_SIZE].copy_(decoded)

    def new_receive_loop() -> None:  # the header's lengths, the counts
        pending.received(kvwire.wire_bytes(parsed.block))
        pending.num_received = 0

    def old_decode() -> None:  # the old kvtensor.decode_block: its length check, checksum and transcode each read `data`
        block = parsed.block
        len(block.data)
        kvwire.validate_block(block, spec)
        data = kvwire.transcode(block.data, block.scales, spec.dtype, tuple(block.header.shape), kvwire.RAW, kvwire.RAW)[0]
        torch.frombuffer(bytearray(data), dtype=dtype).reshape(tuple(block.header.shape))

    parsed = decode_pb2.KvPushMessage.FromString(old_bytes)
    block_bytes = len(old_block.data)
    per_put = max(1, PUT_MESSAGE_BYTES // block_bytes)
    run = BlockRun.of(bytes(old_block.data) * per_put, [HASH] * per_put, 0)
    put = runs_frame([(run, True, b"")])

    def old_put_loop() -> None:  # gRPC's parse, then `_receive`'s length of each run's payload
        message = kvstore_pb2.PutMessage.FromString(put)
        sum(len(r.data) + len(r.scales) for r in message.runs.runs)

    def new_put_loop() -> None:
        put_kind(put), len(put)

    def put_pool(message: kvstore_pb2.PutMessage | None) -> Callable[[], None]:
        def stage() -> None:  # the payload read to stage it; frames parse it here first
            for r in (message or parse_put(put, "runs")).runs.runs:
                r.data, r.scales
        return stage

    old_message = kvstore_pb2.PutMessage.FromString(put)
    stored = block_from_pb(old_block)
    assert block_frame(stored) == block_to_pb(stored).SerializeToString()
    get_bytes = block_frame(stored)
    got_block, got_frame = common_pb2.KvBlock.FromString(get_bytes), kvwire.read_frame(get_bytes)
    out = {
        "send, codec pool: old": cpu_us(lambda: kvtensor.encode_block(kv, block_hash=HASH), n, repeats),
        "send, event loop: old": cpu_us(lambda: decode_pb2.KvPushMessage(block=old_block).SerializeToString(), n, repeats),
        "send, codec pool: frames": cpu_us(lambda: kvtensor.encode_frame(kv, block_hash=HASH, wrap=BLOCK_IN_PUSH), n, repeats),
        "receive, event loop: old": cpu_us(old_receive_loop, n, repeats),
        "receive, codec pool: old": cpu_us(old_decode, n, repeats),
        "receive, codec pool: frames": cpu_us(lambda: read_push(new_bytes, spec, pending), n, repeats),
        "receive, event loop: frames": cpu_us(new_receive_loop, n, repeats),
        "Get, store thread: old": cpu_us(lambda: block_to_pb(codec.convert(stored, Encoding.RAW)), n, repeats),
        "Get, event loop: old": cpu_us(lambda: old_block.SerializeToString(), n, repeats),
        "Get, store thread: frames": cpu_us(lambda: block_frame(codec.convert(stored, Encoding.RAW)), n, repeats),
        "read, codec pool: old": cpu_us(lambda: kvtensor.decode_block(got_block, spec), n, repeats),
        "read, event loop: old": cpu_us(lambda: common_pb2.KvBlock.FromString(get_bytes), n, repeats),
        "read, codec pool: frames": cpu_us(lambda: kvtensor.decode_frame(got_frame, spec), n, repeats),
        "read, event loop: frames": cpu_us(lambda: kvwire.read_frame(get_bytes), n, repeats),
        # a Put message holds `per_put` blocks: its costs a block
        "Put, store thread: old": cpu_us(put_pool(old_message), n, repeats) / per_put,
        "Put, event loop: old": cpu_us(old_put_loop, n, repeats) / per_put,
        "Put, store thread: frames": cpu_us(put_pool(None), n, repeats) / per_put,
        "Put, event loop: frames": cpu_us(new_put_loop, n, repeats) / per_put,
    }
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--blocks", type=int, default=32, help="blocks a pass")
    p.add_argument("--repeats", type=int, default=5, help="passes; the median is shown")
    args = p.parse_args()
    torch.set_num_threads(1)
    print("thread CPU µs a block, the median of passes (the pool: the codec pool or the store's thread)\n")
    print("| block | path | old: pool | old: event loop | frames: pool | frames: event loop | event loop, old / frames | "
          "all, old / frames |")
    print("|---|---|---|---|---|---|---|---|")
    for name, (layers, heads, dim, dtype) in SIZES.items():
        r = measure(layers, heads, dim, dtype, args.blocks, args.repeats)
        for path, step in (("PushKv send", "send"), ("PushKv receive", "receive"), ("KV store Get", "Get"),
                           ("Get read by a worker", "read"), ("KV store Put receive", "Put")):
            pool = "store thread" if step in ("Get", "Put") else "codec pool"
            old_pool, new_pool = r[f"{step}, {pool}: old"], r[f"{step}, {pool}: frames"]
            old_loop, new_loop = r[f"{step}, event loop: old"], r.get(f"{step}, event loop: frames", 0.0)
            ratio = old_loop / new_loop if new_loop >= 0.05 else 0.0
            loop_ratio = "all of it" if not ratio else f"{ratio:.1f}x" if ratio < 10 else f"{ratio:.0f}x"
            print(f"| {name} | {path} | {old_pool:.0f} | {old_loop:.0f} | {new_pool:.0f} | {new_loop:.2f} | {loop_ratio} | "
                  f"{(old_pool + old_loop) / (new_pool + new_loop):.2f}x |")


if __name__ == "__main__":
    main()
