"""What one request's routing costs in gRPC itself: the Routes stream against unary Route + Complete.

    nice -n 5 .venv/bin/python bench/grpccost.py [--requests 4000] [--concurrency 32] [--rounds 2]

A bare Scheduler servicer (no policy, no tracing: it answers every route at once) in its own
process; the client drives `--requests` requests at `--concurrency`, each one route, its answer
and a complete, over one Routes stream and then over unary Route + Complete, alternating for
`--rounds`. Prints CPU µs per request in the client and in the server (user + system, from
getrusage), and the stream's cost over the unary's. This is the floor under the gateway's and the
scheduler's cost per request: grpc aio's own work plus the kernel's, not kvmesh's.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import subprocess
import sys
import time

import grpc

from kvmesh.runtime.pb import scheduler_pb2, scheduler_pb2_grpc
from kvmesh.runtime.launcher import free_port


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class BareScheduler(scheduler_pb2_grpc.SchedulerServicer):
    async def Route(self, request, context):  # noqa: ANN001, N802
        return scheduler_pb2.RouteResponse()

    async def Complete(self, request, context):  # noqa: ANN001, N802
        return scheduler_pb2.CompleteResponse()

    async def Routes(self, requests, context):  # noqa: ANN001, N802
        async for msg in requests:
            if msg.WhichOneof("msg") == "route":
                yield scheduler_pb2.RouteStreamResponse(request_id=msg.route.request.request_id)


async def serve(port: int) -> None:
    """The server child: answers "cpu" on stdin with its CPU seconds so far."""
    server = grpc.aio.server()
    scheduler_pb2_grpc.add_SchedulerServicer_to_server(BareScheduler(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print("ready", flush=True)
    while (line := await asyncio.to_thread(sys.stdin.readline)):
        print(cpu_s(), flush=True)


def route_request(i: int) -> scheduler_pb2.RouteRequest:
    return scheduler_pb2.RouteRequest(request_id=f"r{i}", model="tiny", num_prompt_tokens=100, block_hashes=[bytes(32)] * 6)


async def over_stream(stub, first: int, n: int, concurrency: int) -> None:  # noqa: ANN001
    outbox: asyncio.Queue = asyncio.Queue()
    waiting: dict[str, asyncio.Future] = {}

    async def frames():
        while (msg := await outbox.get()) is not None:
            yield msg

    call = stub.Routes(frames())

    async def read() -> None:
        async for reply in call:
            waiting.pop(reply.request_id).set_result(None)

    reader = asyncio.create_task(read())
    gate = asyncio.Semaphore(concurrency)
    loop = asyncio.get_running_loop()

    async def one(i: int) -> None:
        async with gate:
            answered = waiting[f"r{i}"] = loop.create_future()
            outbox.put_nowait(scheduler_pb2.RouteStreamRequest(route=scheduler_pb2.StreamedRoute(request=route_request(i))))
            await answered
            outbox.put_nowait(scheduler_pb2.RouteStreamRequest(complete=scheduler_pb2.CompleteRequest(request_id=f"r{i}")))

    await asyncio.gather(*(one(i) for i in range(first, first + n)))
    outbox.put_nowait(None)
    reader.cancel()


async def over_unary(stub, first: int, n: int, concurrency: int) -> None:  # noqa: ANN001
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with gate:
            await stub.Route(route_request(i))
            await stub.Complete(scheduler_pb2.CompleteRequest(request_id=f"r{i}"))

    await asyncio.gather(*(one(i) for i in range(first, first + n)))


async def measure(port: int, server_cpu, requests: int, concurrency: int, rounds: int) -> dict[str, list[tuple[float, float]]]:  # noqa: ANN001
    out: dict[str, list[tuple[float, float]]] = {"stream": [], "unary": []}
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        await over_stream(stub, 0, 200, concurrency)  # warm up both paths
        await over_unary(stub, 0, 200, concurrency)
        for r in range(rounds):
            for name, drive in (("stream", over_stream), ("unary", over_unary)):
                c0, s0 = cpu_s(), server_cpu()
                await drive(stub, (r + 1) * 10 * requests, requests, concurrency)
                out[name].append(((cpu_s() - c0) / requests * 1e6, (server_cpu() - s0) / requests * 1e6))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=4000)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        asyncio.run(serve(args.serve))
        return
    port = free_port()
    child = subprocess.Popen([sys.executable, __file__, "--serve", str(port)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"

        def server_cpu() -> float:
            child.stdin.write("cpu\n")
            child.stdin.flush()
            return float(child.stdout.readline())

        print(f"load average {os.getloadavg()[0]:.1f}; {args.requests} requests at concurrency {args.concurrency}")
        t0 = time.perf_counter()
        out = asyncio.run(measure(port, server_cpu, args.requests, args.concurrency, args.rounds))
        print(f"{'path':8} {'client µs/request':>18} {'server µs/request':>18}")
        for name, runs in out.items():
            print(f"{name:8} {', '.join(f'{c:.0f}' for c, _ in runs):>18} {', '.join(f'{s:.0f}' for _, s in runs):>18}")
        mean = {name: [sum(x[k] for x in runs) / len(runs) for k in (0, 1)] for name, runs in out.items()}
        print(f"stream / unary: client {mean['stream'][0] / mean['unary'][0]:.2f}x, server {mean['stream'][1] / mean['unary'][1]:.2f}x "
              f"({time.perf_counter() - t0:.0f} s)")
    finally:
        child.stdin.close()
        child.wait(10)


if __name__ == "__main__":
    main()
