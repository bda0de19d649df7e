"""A second, independent kvmesh decode worker: Hugging Face `transformers` with a non-paged cache.

It imports nothing from kvmesh but the generated protobuf stubs (`kvmesh.runtime.pb`) and follows
docs/contracts.md: the DecodeWorker gRPC API, grpc.health.v1, and heartbeats on NATS. It always
prefills locally (a prefill worker named in a request is not used), refuses pushed KV, keeps no
prefix cache (so it publishes no KV events) and hands nothing back to the KV store.

    python examples/hf_decode/worker.py --model-dir DIR --model-name NAME --port 50099 --nats nats://...
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import time
import uuid
from dataclasses import dataclass

import grpc
import nats
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from engine import BadRequest, Engine, Sampling, Step
from kvmesh.runtime.pb import common_pb2, decode_pb2, decode_pb2_grpc, events_pb2

log = logging.getLogger("hf_decode")
SERVICE = "kvmesh.v1.DecodeWorker"


@dataclass(slots=True)
class Running:
    aborted: bool = False


def sampling_from_pb(p: common_pb2.SamplingParams) -> Sampling:
    """proto3 zeros mean "unset" for top_p and max_tokens."""
    return Sampling(temperature=p.temperature, top_p=p.top_p or 1.0, top_k=p.top_k,
                    seed=p.seed if p.HasField("seed") else None, max_tokens=p.max_tokens or 16, stop=tuple(p.stop),
                    stop_token_ids=tuple(p.stop_token_ids), ignore_eos=p.ignore_eos,
                    logprobs=p.logprobs if p.HasField("logprobs") else None)


def reply_of(steps: list[Step], prompt_tokens: int, completion_tokens: int) -> decode_pb2.GenerateResponse:
    reply = decode_pb2.GenerateResponse(token_ids=[s.token_id for s in steps], text="".join(s.text for s in steps))
    for s in steps:
        if s.logprob is not None:
            reply.logprobs.append(common_pb2.TokenLogprob(token_id=s.token_id, logprob=s.logprob[0], top=[
                common_pb2.TopLogprob(token_id=t, logprob=v) for t, v in s.logprob[1]]))
    finish = steps[-1].finish_reason if steps else None
    if finish:
        reply.finish_reason = finish
        reply.usage.CopyFrom(common_pb2.Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens))
    return reply


class DecodeServicer(decode_pb2_grpc.DecodeWorkerServicer):
    def __init__(self, engine: Engine, max_num_seqs: int) -> None:
        self.engine = engine
        self.max_num_seqs = max_num_seqs
        self.running: dict[str, Running] = {}
        self.draining = False
        self.served = 0
        self._model = asyncio.Lock()   # one forward pass at a time; requests interleave per step

    async def Generate(self, request, context):  # noqa: ANN001, N802
        if self.draining:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "draining; retry on another worker")
        if len(self.running) >= 4 * self.max_num_seqs:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "worker is full")
        rid = request.request_id or uuid.uuid4().hex
        if rid in self.running:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"request id {rid!r} is already running here")
        try:
            seq = self.engine.start(list(request.prompt_token_ids), sampling_from_pb(request.sampling))
        except BadRequest as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        state = self.running[rid] = Running()
        try:
            while seq.finish_reason is None:
                if state.aborted:
                    usage = common_pb2.Usage(prompt_tokens=len(seq.prompt), completion_tokens=len(seq.output))
                    yield decode_pb2.GenerateResponse(finish_reason="abort", usage=usage)
                    return
                async with self._model:
                    step = await asyncio.to_thread(self.engine.step, seq)
                yield reply_of([step], len(seq.prompt), len(seq.output))
            self.served += 1
            log.info("served %s: %d tokens (%s)", rid, len(seq.output), seq.finish_reason)
        finally:
            del self.running[rid]

    async def Stream(self, request_iterator, context):  # noqa: ANN001, N802
        """The multiplexed token stream (docs/token-stream.md): requests start and stop by message;
        each one's new token ids (no text) leave as RequestDeltas, one StepOutput per step."""
        out: asyncio.Queue[decode_pb2.RequestDelta] = asyncio.Queue()
        tasks: dict[str, asyncio.Task] = {}

        async def read() -> None:
            async for msg in request_iterator:
                kind = msg.WhichOneof("msg")
                if kind == "generate":
                    rid = msg.generate.request_id
                    tasks[rid] = asyncio.create_task(self._stream_one(msg.generate, out))
                elif kind == "abort" and msg.abort.request_id in self.running:
                    self.running[msg.abort.request_id].aborted = True

        reader = asyncio.create_task(read())
        try:
            while True:
                deltas = [await out.get()]
                while not out.empty():
                    deltas.append(out.get_nowait())
                yield decode_pb2.StepOutput(deltas=deltas)
        finally:
            reader.cancel()
            for task in tasks.values():
                task.cancel()

    async def _stream_one(self, request: decode_pb2.GenerateRequest, out: asyncio.Queue) -> None:
        rid = request.request_id

        def fail(code: grpc.StatusCode, message: str) -> None:
            out.put_nowait(decode_pb2.RequestDelta(request_id=rid, error_code=code.value[0], error_message=message))

        if not rid or rid in self.running:
            return fail(grpc.StatusCode.INVALID_ARGUMENT, f"request id {rid!r} is empty or already running here")
        if self.draining:
            return fail(grpc.StatusCode.UNAVAILABLE, "draining; retry on another worker")
        sampling = sampling_from_pb(request.sampling)
        sampling.stop = ()   # NOTE: on the Stream the client matches stop strings (docs/token-stream.md)
        try:
            seq = self.engine.start(list(request.prompt_token_ids), sampling)
        except BadRequest as exc:
            return fail(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        state = self.running[rid] = Running()
        try:
            while seq.finish_reason is None and not state.aborted:
                async with self._model:
                    step = await asyncio.to_thread(self.engine.step, seq)
                delta = reply_of([step], len(seq.prompt), len(seq.output))
                out.put_nowait(decode_pb2.RequestDelta(request_id=rid, token_ids=delta.token_ids, logprobs=delta.logprobs,
                                                       finish_reason=delta.finish_reason, usage=delta.usage if
                                                       delta.HasField("usage") else None))
            if state.aborted:
                out.put_nowait(decode_pb2.RequestDelta(request_id=rid, finish_reason="abort", usage=common_pb2.Usage(
                    prompt_tokens=len(seq.prompt), completion_tokens=len(seq.output))))
            self.served += 1
            log.info("served %s: %d tokens (%s)", rid, len(seq.output), seq.finish_reason or "abort")
        finally:
            del self.running[rid]

    async def Abort(self, request, context):  # noqa: ANN001, N802
        state = self.running.get(request.request_id)
        if state is not None:
            state.aborted = True
        return decode_pb2.AbortResponse(found=state is not None)

    async def PushKv(self, request_iterator, context):  # noqa: ANN001, N802
        first = await anext(aiter(request_iterator), None)
        if first is None or first.WhichOneof("msg") != "open":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "a KV push must start with KvPushOpen")
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "this worker prefills locally; it takes no pushed KV")


class Heartbeats:
    """Heartbeat on kvmesh.workers.decode.<id>.heartbeat every `interval_s` (docs/contracts.md)."""

    def __init__(self, nc, servicer: DecodeServicer, args: argparse.Namespace, endpoint: str) -> None:  # noqa: ANN001
        self.nc, self.servicer, self.args, self.endpoint = nc, servicer, args, endpoint
        self.started_at = time.time()
        self.subject = f"kvmesh.workers.decode.{args.worker_id}.heartbeat"

    def message(self) -> events_pb2.Heartbeat:
        return events_pb2.Heartbeat(
            worker_id=self.args.worker_id, role=common_pb2.WORKER_ROLE_DECODE, endpoint=self.endpoint,
            pool=self.args.pool, model=self.args.model_name, block_size=self.args.block_size,
            num_running=len(self.servicer.running), max_num_seqs=self.args.max_num_seqs, timestamp=time.time(),
            started_at=self.started_at, draining=self.servicer.draining,
            live_requests=events_pb2.LiveRequests(request_ids=list(self.servicer.running)))

    async def beat(self) -> None:
        try:
            await self.nc.publish(self.subject, self.message().SerializeToString())
        except Exception as exc:  # noqa: BLE001 - NATS away: the next beat tries again
            log.debug("heartbeat not sent: %s", exc)

    async def run(self) -> None:
        while True:
            await self.beat()
            await asyncio.sleep(self.args.heartbeat_interval)


async def connect_nats(url: str, tries: int = 120):  # noqa: ANN201
    """NATS may come up after this worker (`kvmesh up --external` starts it): keep trying."""
    for _ in range(tries - 1):
        try:
            return await nats.connect(url, max_reconnect_attempts=-1, reconnect_time_wait=0.5, connect_timeout=1)
        except Exception as exc:  # noqa: BLE001 - retried
            log.info("NATS not reachable yet (%s); retrying", exc)
            await asyncio.sleep(0.5)
    return await nats.connect(url, max_reconnect_attempts=-1, reconnect_time_wait=0.5)


async def serve(args: argparse.Namespace) -> None:
    engine = await asyncio.to_thread(Engine, args.model_dir, args.dtype)
    servicer = DecodeServicer(engine, args.max_num_seqs)
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0), ("grpc.max_receive_message_length", 64 << 20)])
    decode_pb2_grpc.add_DecodeWorkerServicer_to_server(servicer, server)
    status = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(status, server)
    port = server.add_insecure_port(f"{args.host}:{args.port}")
    await server.start()
    for name in ("", SERVICE):
        await status.set(name, health_pb2.HealthCheckResponse.SERVING)
    endpoint = f"{args.advertise_host or args.host}:{port}"
    nc = await connect_nats(args.nats) if args.nats else None
    beats = Heartbeats(nc, servicer, args, endpoint) if nc else None
    task = asyncio.create_task(beats.run()) if beats else None
    log.info("hf_decode %s serving %s on %s", args.worker_id, args.model_name, endpoint)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await stop.wait()
    # drain: not serving, one draining heartbeat, let in-flight requests finish
    servicer.draining = True
    for name in ("", SERVICE):
        await status.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    if task:
        task.cancel()
        await beats.beat()
    deadline = time.monotonic() + args.drain_grace
    while servicer.running and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    await server.stop(1.0)
    if nc:
        await nc.drain()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", required=True, help="HF-format model directory (config.json, safetensors, tokenizer.json)")
    p.add_argument("--model-name", required=True, help="the served model name (the mesh's block-hash model id)")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--advertise-host", default="")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--nats", default=os.environ.get("KVMESH_NATS_URL", ""), help="NATS URL (heartbeats)")
    p.add_argument("--worker-id", default=f"hf-decode-{socket.gethostname()}-{os.getpid()}")
    p.add_argument("--pool", default="production")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-num-seqs", type=int, default=8)
    p.add_argument("--heartbeat-interval", type=float, default=0.5)
    p.add_argument("--drain-grace", type=float, default=10.0)
    p.add_argument("--torch-threads", type=int, default=0)
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.torch_threads:
        import torch  # noqa: PLC0415

        torch.set_num_threads(args.torch_threads)
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
