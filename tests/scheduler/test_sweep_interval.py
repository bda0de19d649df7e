"""How often the scheduler sweeps for silent workers: a sixth of the heartbeat timeout, at most 0.5 s."""

from __future__ import annotations

import pytest

from kvmesh.scheduler.feeds import sweep_interval


@pytest.mark.parametrize(("timeout_s", "interval_s"), [(3.0, 0.5), (30.0, 0.5), (1.0, 1 / 6), (0.3, 0.05)])
def test_the_sweep_follows_the_heartbeat_timeout(timeout_s: float, interval_s: float) -> None:
    assert sweep_interval(timeout_s) == pytest.approx(interval_s)
