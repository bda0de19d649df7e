"""What crosses between a worker and its engine process (`engineproc.py`, `enginehost.py`).

A frame is `<u32 header_len><u32 blobs_len>`, an orjson header, then raw bytes. The header is
plain JSON data; tensors and `bytes` in a command's arguments or result travel as raw bytes in
the frame's blob section, named in the header by `{"$t": offset, "n": nbytes, "d": dtype, "s":
shape}` / `{"$b": offset, "n": nbytes}`; SamplingParams as `{"$p": [field values]}`. No pickle,
marshal or eval: a frame can only ever decode to JSON values, tensors, bytes and SamplingParams.

Header kinds, parent -> child: `hello` (settings), `cmd` (id, name, args; `t`: run off the step
loop), `stop`. Child -> parent: `ready` (the engine's identity) or `fail`, `reply` (id, value or
error), `step` (at most one per engine step: every due output, stats, step and progress counts,
KV events).
"""

from __future__ import annotations

import dataclasses
import math
import struct
from typing import Any

import orjson
import torch

from kvmesh.engine.outputs import EngineStats, RequestOutput, TokenLogprob
from kvmesh.engine.sampling import SamplingParams

from .kvtensor import TORCH_DTYPES, byte_view

Buffer = bytes | memoryview  # a frame's part: bytes, or a view of a tensor's memory (`kvtensor.byte_view`)
Blobs = bytearray | memoryview  # a received frame's blob section, writable (torch.frombuffer views it)

PREFIX = struct.Struct("<II")  # header length, blobs length
_PARAM_FIELDS = [f.name for f in dataclasses.fields(SamplingParams)]
_STATS_FIELDS = [f.name for f in dataclasses.fields(EngineStats)]


def frame(header: dict, blobs: list[Buffer] = ()) -> bytes:
    """One frame: header (plain JSON data, blob offsets already in it) and its blobs."""
    return b"".join(frame_parts(header, blobs))


def frame_parts(header: dict, blobs: list[Buffer] = ()) -> list[Buffer]:
    """`frame` as its parts, the blobs not copied: for a scatter-gather send (`sendmsg`) of a frame
    whose blobs are large (a hand-back's KV blocks, ~2 MiB a batch), where joining them cost a copy
    into fresh pages."""
    head = orjson.dumps(header)
    return [PREFIX.pack(len(head), sum(len(b) for b in blobs)) + head, *blobs]


def split(body: bytes | bytearray | memoryview, header_len: int, copy: bool = True) -> tuple[dict, Blobs]:
    """A frame's body (what follows the prefix) as (header, blobs); blobs writable for torch: a copy,
    or without `copy` a view of `body` (which must be a writable buffer the frame owns)."""
    view = memoryview(body)
    return orjson.loads(view[:header_len]), bytearray(view[header_len:]) if copy else view[header_len:]


def take_frames(buf: bytearray, end: int) -> tuple[list[tuple[dict, Blobs]], int]:
    """The whole frames in `buf[:end]`, each `split` (its blobs copied out), and where the first
    one not yet whole starts (`end` when none is)."""
    frames, pos = [], 0
    with memoryview(buf) as view:
        while end - pos >= PREFIX.size:
            header_len, blobs_len = PREFIX.unpack_from(buf, pos)
            start, stop = pos + PREFIX.size, pos + PREFIX.size + header_len + blobs_len
            if stop > end:
                break
            frames.append(split(view[start:stop], header_len))
            pos = stop
    return frames, pos


# -- command arguments and results ----------------------------------------------------------
def pack(value: Any, blobs: list[Buffer]) -> Any:
    """`value` as JSON data; its tensors and bytes appended to `blobs` (see the module docstring)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        if all(type(v) is int for v in value):  # NOTE: token ids (a hand-back's turns): no call per element
            return list(value)
        return [pack(v, blobs) for v in value]
    if isinstance(value, bytes):
        return {"$b": _append(blobs, value), "n": len(value)}
    if isinstance(value, torch.Tensor):
        data = byte_view(value)  # NOTE: not copied: the frame holding it keeps it alive until sent
        return {"$t": _append(blobs, data), "n": len(data), "d": str(value.dtype).removeprefix("torch."),
                "s": list(value.shape)}
    if isinstance(value, SamplingParams):
        # NOTE: its fields are JSON data (numbers, strings, None and tuples of them, which orjson
        # writes as arrays): no call a field (~9 µs a request's add, of ~28 for its frame both ways)
        return {"$p": [getattr(value, f) for f in _PARAM_FIELDS]}
    raise TypeError(f"{type(value).__name__} cannot cross to the engine process")


def _append(blobs: list[Buffer], data: Buffer) -> int:
    offset = sum(len(b) for b in blobs)
    blobs.append(data)
    return offset


def unpack(value: Any, blobs: Blobs) -> Any:
    """The inverse of `pack`; tensors are views of `blobs` (no copy)."""
    if isinstance(value, list):
        if all(type(v) is int for v in value):  # NOTE: token ids, as `pack` sent them
            return value
        return [unpack(v, blobs) for v in value]
    if not isinstance(value, dict):
        return value
    if "$b" in value:
        return bytes(blobs[value["$b"] : value["$b"] + value["n"]])
    if "$t" in value:
        dtype, shape, start, n = TORCH_DTYPES[value["d"]], tuple(value["s"]), value["$t"], value["n"]
        if n == 0:
            return torch.empty(shape, dtype=dtype)
        return torch.frombuffer(memoryview(blobs)[start : start + n], dtype=dtype).reshape(shape)
    if "$p" in value:
        return _params(value["$p"])  # plain JSON data, as `pack` sent it
    raise ValueError(f"unknown value in an engine frame: {sorted(value)}")


def _params(values: list) -> SamplingParams:
    p = dict(zip(_PARAM_FIELDS, values))
    p["stop"], p["stop_token_ids"] = tuple(p["stop"]), tuple(p["stop_token_ids"])
    p["logit_bias"] = tuple(tuple(b) for b in p["logit_bias"])
    p["structured"] = tuple(p["structured"]) if p["structured"] is not None else None
    return SamplingParams(**p)


def error_to_wire(exc: BaseException) -> list[str]:
    """[kind, message]: ValueError stays ValueError (bad input: INVALID_ARGUMENT), the rest RuntimeError."""
    return ["ValueError" if isinstance(exc, ValueError) else "RuntimeError", f"{exc}" or type(exc).__name__]


def error_from_wire(error: list[str]) -> Exception:
    kind, message = error
    return ValueError(message) if kind == "ValueError" else RuntimeError(message)


# -- the step message ----------------------------------------------------------------------------
def _float(x: float) -> float | str:
    return x if math.isfinite(x) else str(x)  # NOTE: JSON has no inf/nan; a masked token's logprob is -inf


def _logprobs_to_wire(lps: list[TokenLogprob] | None) -> list | None:
    if lps is None:
        return None
    return [[lp.token_id, _float(lp.logprob), [[t, _float(v)] for t, v in lp.top_logprobs]] for lp in lps]


def _logprobs_from_wire(lps: list | None) -> list[TokenLogprob] | None:
    if lps is None:
        return None
    return [TokenLogprob(t, float(v), [(a, float(b)) for a, b in top]) for t, v, top in lps]


def output_to_wire(o: RequestOutput) -> list:
    return [o.request_id, o.new_token_ids, o.new_text, o.finished, o.finish_reason, _logprobs_to_wire(o.logprobs),
            o.num_prompt_tokens, o.num_output_tokens, o.num_cached_tokens, o.num_computed_tokens,
            _logprobs_to_wire(o.prompt_logprobs), o.queue_s, o.prefill_s]


def output_from_wire(w: list) -> RequestOutput:
    return RequestOutput(w[0], w[1], w[2], w[3], w[4], _logprobs_from_wire(w[5]), w[6], w[7], w[8], w[9],
                         _logprobs_from_wire(w[10]), w[11], w[12])


def stats_to_wire(s: EngineStats) -> list[int]:
    return [getattr(s, f) for f in _STATS_FIELDS]


def stats_from_wire(w: list[int]) -> EngineStats:
    return EngineStats(*w)


def events_to_wire(events: list[tuple[str, list[bytes], bytes | None]]) -> list:
    """KV cache events (`LLMEngine.take_kv_events`) with their 32-byte hashes in hex."""
    return [[kind, [h.hex() for h in hashes], parent.hex() if parent is not None else None]
            for kind, hashes, parent in events]


def events_from_wire(w: list) -> list[tuple[str, list[bytes], bytes | None]]:
    return [(kind, [bytes.fromhex(h) for h in hashes], bytes.fromhex(parent) if parent is not None else None)
            for kind, hashes, parent in w]
