"""Frames received straight into memory (worker/framereceiver.py) and sent gathered (enginehost.send_all):
every frame arrives whole, in order, however the bytes are cut, and a large one without a copy."""

from __future__ import annotations

import asyncio
import socket
import threading

import pytest
import torch

from kvmesh.worker import enginewire as wire
from kvmesh.worker.enginehost import FrameSocket, send_all
from kvmesh.worker.framereceiver import FrameReceiver


def _frames(sizes: list[int]) -> list[tuple[dict, bytes]]:
    return [({"k": "reply", "i": i}, bytes([i % 251]) * n) for i, n in enumerate(sizes)]


def _feed(receiver: FrameReceiver, data: bytes, cut: int) -> None:
    """Hands `data` to the receiver the way a transport does, at most `cut` bytes a time."""
    at = 0
    while at < len(data):
        buf = receiver.get_buffer(-1)
        n = min(cut, len(buf), len(data) - at)
        assert n > 0
        buf[:n] = data[at:at + n]
        receiver.buffer_updated(n)
        at += n


@pytest.mark.parametrize("cut", [1, 7, 4096, 1 << 20])
def test_every_frame_arrives_whole_and_in_order_however_the_bytes_are_cut(cut: int) -> None:
    sent = _frames([0, 5, 300, 70_000, 3, 300_000, 0, 1_000_000, 12])  # small ones and ones past the scratch
    data = b"".join(wire.frame(header, [blob] if blob else []) for header, blob in sent)
    receiver = FrameReceiver(scratch_bytes=64 * 1024)

    async def read_all() -> list[tuple[dict, bytes]]:
        return [(h, bytes(b)) for h, b in [await receiver.read() for _ in sent]]

    _feed(receiver, data, cut)
    assert asyncio.run(read_all()) == [(h, b) for h, b in sent]


def test_a_large_frame_is_received_into_its_own_buffer_and_its_blobs_are_a_writable_view() -> None:
    receiver = FrameReceiver(scratch_bytes=1024)
    kv = torch.arange(4096, dtype=torch.float32).reshape(4, 1024)
    blobs: list[wire.Buffer] = []
    value = wire.pack([kv], blobs)
    _feed(receiver, b"".join(wire.frame_parts({"v": value}, blobs)), 1000)
    header, got = asyncio.run(receiver.read())
    assert isinstance(got, memoryview) and not got.readonly  # not copied out of a scratch
    back = wire.unpack(header["v"], got)[0]
    assert torch.equal(back, kv)
    back[0, 0] = -1.0  # torch may write to it (frombuffer needs a writable buffer)


def test_a_reader_waiting_at_the_end_gets_an_incomplete_read() -> None:
    receiver = FrameReceiver()

    async def main() -> None:
        reading = asyncio.ensure_future(receiver.read())
        await asyncio.sleep(0)
        _feed(receiver, wire.frame({"k": "step"})[:5], 5)  # a frame cut short, then EOF
        receiver.eof_received()
        with pytest.raises(asyncio.IncompleteReadError):
            await reading

    asyncio.run(main())


def test_reading_pauses_while_frames_pile_up_and_resumes_as_they_are_read(monkeypatch) -> None:
    monkeypatch.setattr("kvmesh.worker.framereceiver.PAUSE_FRAMES", 4)
    calls: list[str] = []

    class Transport:
        def pause_reading(self) -> None:
            calls.append("pause")

        def resume_reading(self) -> None:
            calls.append("resume")

    receiver = FrameReceiver()
    receiver.connection_made(Transport())  # type: ignore[arg-type]
    _feed(receiver, b"".join(wire.frame({"i": i}) for i in range(6)), 1 << 20)
    assert calls == ["pause"]

    async def read(n: int) -> list[int]:
        return [(await receiver.read())[0]["i"] for _ in range(n)]

    assert asyncio.run(read(6)) == list(range(6)) and calls == ["pause", "resume"]


def test_a_gathered_send_of_many_parts_arrives_as_their_concatenation_over_a_real_socket() -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)  # small: sendmsg sends part of it and resumes
    kv = torch.randn(300, 257)  # ~300 KiB from the tensor's own memory
    blobs: list[wire.Buffer] = []
    value = wire.pack([kv, b"tail"], blobs)
    parts = [*wire.frame_parts({"v": value}, blobs), *(b"x" * i for i in range(2000))]  # past IOV_MAX buffers
    expected = b"".join(parts)
    got = bytearray()

    def drain() -> None:
        while len(got) < len(expected):
            got.extend(theirs.recv(65536))

    reader = threading.Thread(target=drain)
    reader.start()
    send_all(ours, parts)
    reader.join(timeout=30)
    assert bytes(got) == expected
    ours.close()
    theirs.close()


def test_the_engine_sockets_send_takes_whole_frames_and_frames_in_parts_together() -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    blobs: list[wire.Buffer] = []
    value = wire.pack(torch.ones(3), blobs)
    FrameSocket(ours).send([wire.frame({"k": "step"}), wire.frame_parts({"k": "reply", "v": value}, blobs)])
    frames = FrameSocket(theirs).poll(5.0)
    assert [h["k"] for h, _ in frames] == ["step", "reply"]
    assert torch.equal(wire.unpack(frames[1][0]["v"], frames[1][1]), torch.ones(3))
    ours.close()
    theirs.close()
