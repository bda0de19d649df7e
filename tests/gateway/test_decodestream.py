"""A request's feed on the token stream: what a slow reader has not taken yet merges into one read."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from kvmesh.gateway.decodestream import RequestFeed, StreamFailed
from kvmesh.runtime.pb import common_pb2, decode_pb2


async def test_tokens_a_slow_reader_has_not_taken_coalesce_into_one_read() -> None:
    feed = RequestFeed(asyncio.get_running_loop())
    for tok in range(5):
        assert not feed.push(decode_pb2.RequestDelta(request_id="r", token_ids=[tok], cached_tokens=3))
    assert feed.push(decode_pb2.RequestDelta(request_id="r", token_ids=[5], finish_reason="length",
                                             usage=common_pb2.Usage(prompt_tokens=2, completion_tokens=6)))
    assert await feed.read() == ([0, 1, 2, 3, 4, 5], [], "length")
    assert feed.cached_tokens == 3 and feed.usage.completion_tokens == 6


async def test_tokens_before_a_failure_are_read_first_then_the_failure() -> None:
    feed = RequestFeed(asyncio.get_running_loop())
    feed.push(decode_pb2.RequestDelta(request_id="r", token_ids=[7, 8]))
    feed.fail(StreamFailed(grpc.StatusCode.UNAVAILABLE, "worker gone"))
    assert await feed.read() == ([7, 8], [], "")
    with pytest.raises(StreamFailed) as failed:
        await feed.read()
    assert failed.value.code is grpc.StatusCode.UNAVAILABLE


async def test_an_error_delta_ends_the_request_and_is_raised_after_its_tokens() -> None:
    feed = RequestFeed(asyncio.get_running_loop())
    assert feed.push(decode_pb2.RequestDelta(request_id="r", token_ids=[4], error_code=grpc.StatusCode.RESOURCE_EXHAUSTED.value[0],
                                             error_message="no room", retry_after_s=2.0))
    assert await feed.read() == ([4], [], "")
    with pytest.raises(StreamFailed) as failed:
        await feed.read()
    assert failed.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED and failed.value.retry_after_s == 2.0
