"""The gateway's context length follows what the workers report through the scheduler."""

from __future__ import annotations

import grpc

from kvmesh.gateway.config import GatewaySettings
from kvmesh.gateway.contextlen import ContextLengthWatch, reported_max_model_len
from kvmesh.gateway.prompt import ServedModel
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

    async def ListWorkers(self, request, timeout: float):  # noqa: N802, ANN001, ANN201
        if self.reply is None:
            raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata())
        return self.reply


class Backend:
    def __init__(self, scheduler: ListingScheduler) -> None:
        self._scheduler = scheduler

    def scheduler(self) -> ListingScheduler:
        return self._scheduler


async def test_watch_lowers_to_the_report_never_above_the_cap_and_keeps_it_when_unreachable() -> None:
    model = ServedModel.load(GatewaySettings(model="tiny"))  # its own: the watch changes it
    assert model.max_model_len == 2048
    scheduler = ListingScheduler(listing(("production", 1500, False)))
    watch = ContextLengthWatch(Backend(scheduler), model, "", 1.0)
    await watch.refresh()
    assert model.max_model_len == 1500
    scheduler.reply = listing(("production", 9000, False))
    await watch.refresh()
    assert model.max_model_len == 2048
    scheduler.reply = None
    await watch.refresh()
    assert model.max_model_len == 2048
