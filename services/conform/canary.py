"""Suite of the canary role (clauses C1.. of docs/contracts.md). The canary under test must be
started with `--scheduler 127.0.0.1:<--scheduler-port>` and the suite's `--nats`: the suite
publishes MirrorRecords and plays the scheduler and a candidate decode worker."""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass, field

import grpc

from kvmesh.runtime.bus import MIRROR_SUBJECT, Bus
from kvmesh.runtime.pb import canary_pb2, canary_pb2_grpc, common_pb2, decode_pb2, events_pb2

from .clauses import Registry, expect, expect_status
from .doubles import Call, FakeDecode, FakeScheduler, Served, add, echo_replies, serve
from .probe import channel, expect_serving, need, wait_for

REGISTRY = Registry("canary", "C")
clause = REGISTRY.clause


@dataclass(slots=True)
class Session:
    opts: object
    channel: grpc.aio.Channel
    stub: canary_pb2_grpc.CanaryStub
    bus: Bus
    scheduler: FakeScheduler
    decode: FakeDecode
    served: list[Served]
    outputs: dict[tuple[int, ...], list[int]] = field(default_factory=dict)   # prompt -> what the candidate answers
    records: list[events_pb2.MirrorRecord] = field(default_factory=list)
    salt: int = field(default_factory=lambda: random.randrange(10**6))   # new prompts each session (dedup)

    def record(self, n: int, salt: str) -> events_pb2.MirrorRecord:
        prompt = [self.salt % 200 + 20, *((n * 31 + i * 7 + len(salt)) % 200 + 20 for i in range(12 + n)), self.salt // 200 % 200 + 20]
        output = [(n + i) % 200 + 20 for i in range(6)]
        self.outputs[tuple(prompt)] = output
        return events_pb2.MirrorRecord(
            request_id=f"conform-{salt}-{n}-{uuid.uuid4().hex[:6]}", model=self.opts.model or "conform-model",
            prompt_token_ids=prompt, output_token_ids=output, finish_reason="length", ttft_s=0.01, tpot_s=0.005,
            sampling=common_pb2.SamplingParams(temperature=0.0, max_tokens=6, seed=3, ignore_eos=True),
            session_id=f"conform-{n}", pool="production")

    async def publish(self, record: events_pb2.MirrorRecord) -> None:
        self.records.append(record)
        await self.bus.publish(MIRROR_SUBJECT, record)

    async def report(self) -> canary_pb2.CanaryReport:
        return await self.stub.GetReport(canary_pb2.GetReportRequest(), timeout=10)

    async def until(self, predicate, timeout_s: float = 10.0) -> canary_pb2.CanaryReport:  # noqa: ANN001
        """The first report for which `predicate(report)` holds (or the last one)."""
        report = await self.report()
        for _ in range(int(timeout_s / 0.1)):
            if predicate(report):
                break
            await wait_for(lambda: False, 0.1)
            report = await self.report()
        return report

    async def close(self) -> None:
        for served in self.served:
            await served.stop()
        await self.bus.close()
        await self.channel.close()


async def open_session(opts) -> Session:  # noqa: ANN001
    need(opts.nats, "needs --nats (mirrored records arrive on NATS)")
    need(opts.scheduler_port, "needs --scheduler-port (start the canary with --scheduler 127.0.0.1:PORT)")
    scheduler = FakeScheduler()
    outputs: dict[tuple[int, ...], list[int]] = {}

    async def generate(request: decode_pb2.GenerateRequest, context, call: Call):  # noqa: ANN001, ANN202
        output = outputs.get(tuple(request.prompt_token_ids), [])
        for reply in echo_replies(output, "", len(request.prompt_token_ids)):
            yield reply

    decode = FakeDecode("conform-candidate", generate)
    served = [await serve(opts.scheduler_port, add(scheduler)), await serve(0, add(decode))]
    scheduler.decode = common_pb2.WorkerRef(worker_id="conform-candidate", endpoint=served[1].endpoint)
    chan = channel(opts.endpoint)
    bus = await Bus.connect(opts.nats, "conform-canary")
    return Session(opts, chan, canary_pb2_grpc.CanaryStub(chan), bus, scheduler, decode, served, outputs)


@clause(1, "health: grpc.health.v1 answers SERVING for the server and kvmesh.v1.Canary")
async def health(ctx: Session) -> None:
    await expect_serving(ctx.channel, ("kvmesh.v1.Canary",))


@clause(2, "GetReport names both pools and a verdict")
async def report(ctx: Session) -> None:
    r = await ctx.report()
    expect(r.verdict != canary_pb2.VERDICT_UNSPECIFIED, "verdict is UNSPECIFIED")
    expect(r.production_pool and r.candidate_pool and r.production_pool != r.candidate_pool,
           f"pools {r.production_pool!r} / {r.candidate_pool!r}")


@clause(3, "MirrorRecords on kvmesh.mirror.requests are counted (mirror_received)")
async def intake(ctx: Session) -> None:
    before = (await ctx.report()).mirror_received
    for n in range(6):
        await ctx.publish(ctx.record(n, "c3"))
    r = await ctx.until(lambda r: r.mirror_received >= before + 6)
    expect(r.mirror_received >= before + 6, f"mirror_received {r.mirror_received}, expected {before + 6}")


@clause(4, "a malformed payload is counted (mirror_malformed) and dropped; the canary keeps serving")
async def malformed(ctx: Session) -> None:
    before = (await ctx.report()).mirror_malformed
    await ctx.bus.client.publish(MIRROR_SUBJECT, b"\xff\xff\xff conform: not a MirrorRecord")
    r = await ctx.until(lambda r: r.mirror_malformed > before)
    expect(r.mirror_malformed == before + 1, f"mirror_malformed {before} → {r.mirror_malformed}")
    await expect_serving(ctx.channel)


@clause(5, "a record seen before (same request id) is refused as a duplicate (mirror_duplicates)")
async def duplicate(ctx: Session) -> None:
    expect(ctx.records, "needs C3's records")
    before = (await ctx.report()).mirror_duplicates
    await ctx.bus.publish(MIRROR_SUBJECT, ctx.records[0])
    r = await ctx.until(lambda r: r.mirror_duplicates > before)
    expect(r.mirror_duplicates == before + 1, f"mirror_duplicates {before} → {r.mirror_duplicates}")


@clause(6, "replay: Route on the candidate pool under a new request id, Generate with the record's prompt and sampling, then Complete")
async def replay(ctx: Session) -> None:
    expect(ctx.records, "needs C3's records")
    candidate = (await ctx.report()).candidate_pool
    ok = await wait_for(lambda: len(ctx.decode.generates) >= len(ctx.records), 15.0)
    expect(ok, f"{len(ctx.decode.generates)} of {len(ctx.records)} records replayed within 15s")
    by_prompt = {tuple(r.prompt_token_ids): r for r in ctx.records}
    for call in ctx.decode.generates:
        record = by_prompt.get(tuple(call.request.prompt_token_ids))
        expect(record is not None, "Generate with a prompt no record had")
        expect(call.request.request_id != record.request_id, "the replay reuses the production request id")
        expect(call.request.sampling == record.sampling, "the replay changed the record's sampling")
        expect(call.deadline_s is not None, "Generate without a deadline")
    routes = [c.request for c in ctx.scheduler.routes]
    expect(any(r.pool == candidate for r in routes), f"no Route on the candidate pool {candidate!r}")
    done = await wait_for(lambda: {c.request_id for c in ctx.scheduler.completes} >= {r.request_id for r in routes}, 5.0)
    expect(done, "a replayed request was never Completed")


@clause(7, "comparison: a candidate that answers the production tokens scores agreement 1.0")
async def agreement(ctx: Session) -> None:
    r = await ctx.until(lambda r: r.samples >= 1)
    expect(r.samples >= 1, "no replay was compared (samples 0)")
    expect(r.exact_match_rate == 1.0 and r.token_agreement == 1.0,
           f"exact_match_rate {r.exact_match_rate}, token_agreement {r.token_agreement} for an identical candidate")


@clause(8, "Promote: a weight outside (0, 1] is INVALID_ARGUMENT; a stepwise weight asks the scheduler for that canary share")
async def promote_step(ctx: Session) -> None:
    await expect_status(ctx.stub.Promote(canary_pb2.PromoteRequest(weight=1.5), timeout=10),
                        grpc.StatusCode.INVALID_ARGUMENT, what="Promote(weight=1.5)")
    pools = await ctx.report()
    await ctx.stub.Promote(canary_pb2.PromoteRequest(weight=0.25), timeout=10)
    change = ctx.scheduler.pool_changes[-1] if ctx.scheduler.pool_changes else None
    expect(change is not None, "a stepwise Promote did not call Scheduler.SetProductionPool")
    expect((change.pool, change.canary_pool, round(change.canary_weight, 6)) == (pools.production_pool, pools.candidate_pool, 0.25),
           f"SetProductionPool({change.pool!r}, {change.canary_pool!r}, {change.canary_weight}) for a 0.25 promote")
    expect(abs((await ctx.report()).promoted_weight - 0.25) < 1e-9, "report.promoted_weight is not 0.25")


@clause(9, "a full Promote makes the candidate pool production; Rollback restores the production pool")
async def promote_rollback(ctx: Session) -> None:
    pools = await ctx.report()
    reply = await ctx.stub.Promote(canary_pb2.PromoteRequest(weight=1.0), timeout=10)
    change = ctx.scheduler.pool_changes[-1]
    expect(change.pool == pools.candidate_pool and change.canary_weight == 0,
           f"full promote sent SetProductionPool({change.pool!r}, weight {change.canary_weight})")
    expect(reply.production_pool == pools.candidate_pool, f"PromoteResponse.production_pool {reply.production_pool!r}")
    back = await ctx.stub.Rollback(canary_pb2.RollbackRequest(), timeout=10)
    change = ctx.scheduler.pool_changes[-1]
    expect(change.pool == pools.production_pool and change.canary_weight == 0,
           f"rollback sent SetProductionPool({change.pool!r}, weight {change.canary_weight})")
    expect(back.production_pool == pools.production_pool, f"RollbackResponse.production_pool {back.production_pool!r}")
