"""The gateway's context length follows what the workers report through the scheduler; the
worker list it reads is shared with /health (one ListWorkers call for both)."""

from __future__ import annotations

import asyncio

import grpc

from kvmesh.gateway.config import GatewaySettings
from kvmesh.gateway.contextlen import ContextLengthWatch, reported_max_model_len
from kvmesh.gateway.failover import EndpointRing
from kvmesh.gateway.prompt import ServedModel
from kvmesh.gateway.workerlist import WorkerList
from tests.fakeclock import FakeClock
from kvmesh.runtime.pb import scheduler_pb2


def listing(*workers: tuple[str, int, bool], production: str = "production") -> scheduler_pb2.ListWorkersResponse:
    reply = scheduler_pb2.ListWorkersResponse(production_pool=production)
    for pool, max_len, draining in workers:
        reply.workers.add(worker_id=f"w{len(reply.workers)}", pool=pool, max_model_len=max_len, draining=draining)
    return reply


def test_smallest_live_report_of_the_routed_pool_wins() -> None:
    reply = listing(("production", 8192, False), ("production", 4096, False), ("production", 1024, True),
                    ("candidate", 512, False), ("production", 0, False))
    assert reported_max_model_len(reply, "") == 4096
    assert reported_max_model_len(reply, "candidate") == 512
    assert reported_max_model_len(listing(("production", 0, False)), "") is None
    assert reported_max_model_len(listing(("blue", 300, False), production="blue"), "") == 300


class ListingScheduler:
    """Answers ListWorkers with a set reply (or fails it)."""

    def __init__(self, reply: scheduler_pb2.ListWorkersResponse | None) -> None:
        self.reply = reply
        self.calls = 0

    async def ListWorkers(self, request, timeout: float):  # noqa: N802, ANN001, ANN201
        self.calls += 1
        await asyncio.sleep(0.01)
        if self.reply is None:
            raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata())
        return self.reply


class Backend:
    def __init__(self, scheduler: ListingScheduler) -> None:
        self._scheduler = scheduler
        self.schedulers = EndpointRing(["127.0.0.1:1"])

    def scheduler(self, endpoint: str = "") -> ListingScheduler:
        return self._scheduler


async def test_watch_lowers_to_the_report_never_above_the_cap_and_keeps_it_when_unreachable() -> None:
    model = ServedModel.load(GatewaySettings(model="tiny"))  # its own: the watch changes it
    assert model.max_model_len == 2048
    scheduler = ListingScheduler(listing(("production", 1500, False)))
    watch = ContextLengthWatch(WorkerList(Backend(scheduler)), model, "", 1.0)
    await watch.refresh()
    assert model.max_model_len == 1500
    scheduler.reply = listing(("production", 9000, False))
    await watch.refresh()
    assert model.max_model_len == 2048
    scheduler.reply = None
    await watch.refresh()
    assert model.max_model_len == 2048


async def test_readers_share_one_call_and_reuse_a_list_younger_than_their_max_age() -> None:
    """Issue 16 review: the context length watch and /health read ListWorkers once between them."""
    scheduler, clock = ListingScheduler(listing(("production", 1500, False))), FakeClock()
    workers = WorkerList(Backend(scheduler), clock=clock)
    first, second = await asyncio.gather(workers.read(), workers.read(max_age_s=1.0))
    assert first is second is scheduler.reply and scheduler.calls == 1  # concurrent: one call
    clock.advance(0.5)
    assert await workers.read(max_age_s=1.0) is first and scheduler.calls == 1  # young enough
    scheduler.reply = None
    assert await workers.read() is None and workers.error == "UNAVAILABLE" and scheduler.calls == 2
    assert await workers.read(max_age_s=1.0) is None and scheduler.calls == 2  # a failure is reused too
