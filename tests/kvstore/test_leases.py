"""LeaseTable: leases end at their own expiry times, whatever order they were granted in."""

from __future__ import annotations

from kvmesh.kvstore.leases import LeaseTable

A, B, C = ("ns", b"a"), ("ns", b"b"), ("ns", b"c")


def test_leases_expire_in_time_order_and_only_once():
    table = LeaseTable()
    table.grant([A, B], expires_at=10.0)
    table.grant([C], expires_at=5.0)
    table.grant([A], expires_at=5.0)
    assert table.expire(4.9) == [] and len(table) == 3
    assert sorted(table.expire(6.0)) == [A, C] and len(table) == 1
    assert table.expire(6.0) == []
    assert table.expire(10.0) == [A, B] and len(table) == 0
