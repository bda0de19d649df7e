"""A worker's engine-process pipe with large replies (a hand-back's KV blocks): the old path
against the new, CPU per MiB on each side, side by side in one run.

    .venv/bin/python bench/enginepipe.py [--mib 2,16,64] [--frames 20]

old: the engine process copies the tensor to bytes, joins the frame, joins the frames to send
(`sendall`); the worker reads with an `asyncio.StreamReader` (its growing buffer, `readexactly`'s
slice and bytes) and copies the blobs out (`enginewire.split`). new: the engine process sends the
tensor's own memory (`frame_parts`, `send_all`'s `sendmsg`); the worker receives into the frame's
own buffer (`FrameReceiver`) and views its blobs. Both sides over a real Unix socket pair, the
sender in its own process, on uvloop as the worker runs; each side's CPU is its own process time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
import time

import torch

from kvmesh.runtime.process import run_service
from kvmesh.worker import enginewire as wire
from kvmesh.worker.enginehost import FrameSocket
from kvmesh.worker.framereceiver import FrameReceiver
from kvmesh.worker.kvtensor import to_bytes


def send(kind: str, fd: int, mib: int, frames: int) -> float:
    """The engine process's side: `frames` replies of a `mib` MiB tensor each; its CPU seconds."""
    sock = socket.socket(fileno=fd)
    kv = torch.randn(mib * 1024 * 1024 // 4)
    conn = FrameSocket(sock)
    t0 = time.process_time()
    for i in range(frames):
        if kind == "old":
            data = to_bytes(kv)
            reply = wire.frame({"k": "reply", "i": i, "v": {"$b": 0, "n": len(data)}}, [data])
            sock.sendall(b"".join([reply]))
        else:
            blobs: list[wire.Buffer] = []
            value = wire.pack(kv, blobs)
            conn.send([wire.frame_parts({"k": "reply", "i": i, "v": value}, blobs)])
    return time.process_time() - t0


async def receive(kind: str, sock: socket.socket, frames: int) -> float:
    """The worker's side: reads `frames` frames and views each as a tensor; its CPU seconds."""
    loop = asyncio.get_running_loop()
    t0 = time.process_time()
    if kind == "old":
        reader, writer = await asyncio.open_unix_connection(sock=sock, limit=1 << 20)  # NOTE: held: a collected writer closes
        for _ in range(frames):
            header_len, blobs_len = wire.PREFIX.unpack(await reader.readexactly(wire.PREFIX.size))
            header, blobs = wire.split(await reader.readexactly(header_len + blobs_len), header_len)
            torch.frombuffer(blobs, dtype=torch.uint8)
        writer.close()
    else:
        transport, receiver = await loop.create_unix_connection(FrameReceiver, sock=sock)
        for _ in range(frames):
            header, blobs = await receiver.read()
            wire.unpack(header["v"], blobs)
        transport.close()
    return time.process_time() - t0


def one(kind: str, mib: int, frames: int) -> dict:
    """Both sides of one path; each side's CPU seconds."""
    import subprocess

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    sender = subprocess.Popen([sys.executable, __file__, "--send", kind, str(mib), str(frames), str(theirs.fileno())],
                              pass_fds=(theirs.fileno(),), stdout=subprocess.PIPE, text=True)
    theirs.close()
    receiver_cpu = run_service(receive(kind, ours, frames))
    out, _ = sender.communicate(timeout=300)
    if sender.returncode != 0:
        raise RuntimeError(f"the sender exited {sender.returncode}")
    return {**json.loads(out.strip().splitlines()[-1]), "receiver_cpu_s": receiver_cpu}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mib", default="2,16,64", help="reply sizes in MiB, comma-separated")
    p.add_argument("--frames", type=int, default=20)
    p.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    p.add_argument("--send", nargs=4, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.send:  # the engine process's side
        torch.set_num_threads(1)
        print(json.dumps({"sender_cpu_s": send(args.send[0], int(args.send[3]), int(args.send[1]), int(args.send[2]))}))
        return 0
    if args.child:  # one measurement in fresh processes: neither path warms the other's heap
        print(json.dumps(one(args.child[0], int(args.child[1]), int(args.child[2]))))
        return 0
    import subprocess

    torch.set_num_threads(1)
    print("| reply MiB | path | engine process CPU ms/MiB | worker CPU ms/MiB |\n|---|---|---|---|")
    for mib in (int(m) for m in args.mib.split(",")):
        rows = {}
        for kind in ("old", "new"):
            out = subprocess.run([sys.executable, __file__, "--child", kind, str(mib), str(args.frames)],
                                 check=True, capture_output=True, text=True).stdout.split("\n")
            figures = {k: v for line in out if line.startswith("{") for k, v in json.loads(line).items()}
            total = mib * args.frames
            rows[kind] = (figures["sender_cpu_s"] / total * 1e3, figures["receiver_cpu_s"] / total * 1e3)
            print(f"| {mib} | {kind} | {rows[kind][0]:.3f} | {rows[kind][1]:.3f} |")
        print(f"| {mib} | new / old | {rows['new'][0] / rows['old'][0]:.2f}x | {rows['new'][1] / rows['old'][1]:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
