import pytest

from kvmesh.scheduler.admission import AdmissionConfig, AdmissionQueue, Order, QueueFull

from .helpers import FakeClock


def make(order: Order = Order.FCFS, slots: int = 2, queue_factor: float = 1.0, aging_quota: int = 8) -> AdmissionQueue:
    queue = AdmissionQueue(AdmissionConfig(queue_factor=queue_factor, order=order, aging_quota=aging_quota), FakeClock())
    queue.set_capacity(slots)
    return queue


def test_requests_are_admitted_up_to_the_slots_then_queued_then_refused():
    queue = make(slots=2, queue_factor=1.0)
    assert queue.offer("a", 10) and queue.offer("b", 10)
    assert not queue.offer("c", 10) and not queue.offer("d", 10)
    with pytest.raises(QueueFull) as refused:
        queue.offer("e", 10)
    assert 1.0 <= refused.value.retry_after_s <= 30.0
    assert (queue.active, queue.depth) == (2, 2)


def test_fcfs_admits_in_arrival_order_as_slots_free():
    queue = make(slots=1, queue_factor=3.0)
    queue.offer("a", 1)
    for rid, cost in (("b", 500), ("c", 5), ("d", 50)):
        queue.offer(rid, cost)
    assert queue.release("a") == ["b"]
    assert queue.release("b") == ["c"]


def test_short_first_admits_the_shortest_waiting_request():
    queue = make(Order.SHORT_FIRST, slots=1, queue_factor=3.0)
    queue.offer("a", 1)
    for rid, cost in (("long", 500), ("short", 5), ("mid", 50)):
        queue.offer(rid, cost)
    assert queue.release("a") == ["short"]
    assert queue.release("short") == ["mid"]


def test_short_first_ages_long_requests_so_they_are_never_starved():
    queue = make(Order.SHORT_FIRST, slots=1, queue_factor=10.0, aging_quota=2)
    queue.offer("running", 1)
    queue.offer("long", 1000)
    order = []
    current = "running"
    for i in range(4):
        queue.offer(f"s{i}", 1)
        current = queue.release(current)[0]
        order.append(current)
    assert order == ["s0", "s1", "long", "s2"]


def test_capacity_growth_admits_waiting_requests_and_cancel_leaves_the_queue():
    queue = make(slots=1, queue_factor=2.0)
    queue.offer("a", 1)
    queue.offer("b", 1)
    queue.offer("c", 1)
    queue.cancel("b")
    assert queue.set_capacity(3) == ["c"]
    assert queue.depth == 0


def test_slots_whose_complete_never_came_are_reclaimed():
    clock = FakeClock()
    queue = AdmissionQueue(AdmissionConfig(slot_timeout_s=60.0), clock)
    queue.set_capacity(1)
    queue.offer("lost", 1)
    queue.offer("next", 1)
    clock.advance(61.0)
    assert queue.reclaim() == ["next"]


def test_no_capacity_refuses_at_once():
    queue = make(slots=0)
    with pytest.raises(QueueFull):
        queue.offer("a", 1)


@pytest.mark.parametrize("order", [Order.FCFS, Order.SHORT_FIRST])
def test_lower_priority_value_is_admitted_first(order: Order):
    queue = make(order, slots=1, queue_factor=4.0)
    queue.offer("running", 1)
    queue.offer("low", 1, priority=5)
    queue.offer("normal", 1)
    queue.offer("high", 500, priority=-1)
    assert queue.release("running") == ["high"]
    assert queue.release("high") == ["normal"]
    assert queue.release("normal") == ["low"]


def test_aging_keeps_low_priority_from_starving():
    queue = make(slots=1, queue_factor=10.0, aging_quota=2)
    queue.offer("running", 1)
    queue.offer("low", 1, priority=9)
    admitted = []
    for i in range(4):
        queue.offer(f"high{i}", 1, priority=0)
        admitted += queue.release(admitted[-1] if admitted else "running")
    # overtaken twice, "low" goes next although high-priority requests are still waiting.
    assert admitted[:3] == ["high0", "high1", "low"]
