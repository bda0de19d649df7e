"""Scheduler settings refuse what would silently mean something else."""

import pytest

from kvmesh.scheduler.config import SchedulerSettings


def test_the_removed_utilization_decay_is_refused_with_its_replacement_named():
    settings = SchedulerSettings()
    settings.check(environ={})
    with pytest.raises(ValueError, match="replaced by KVMESH_SCHEDULER_KV_OVERLAP_DECAY_REQUESTS"):
        settings.check(environ={"KVMESH_SCHEDULER_KV_OVERLAP_DECAY": "0.5"})


@pytest.mark.parametrize(("field", "value", "message"), [("policy", "random", "unknown policy"),
                                                         ("queue_order", "lifo", "unknown queue_order")])
def test_unknown_policy_and_queue_order_are_refused(field, value, message):
    with pytest.raises(ValueError, match=message):
        SchedulerSettings(**{field: value}).check(environ={})
