"""The engine process's wire: values, SamplingParams and step outputs survive a frame exactly."""

from __future__ import annotations

import pytest
import torch

from kvmesh.engine.outputs import RequestOutput, TokenLogprob
from kvmesh.engine.sampling import SamplingParams
from kvmesh.worker import enginewire as wire


def through_a_frame(header: dict, blobs: list[bytes]) -> tuple[dict, bytearray]:
    data = wire.frame(header, blobs)
    header_len, blobs_len = wire.PREFIX.unpack_from(data)
    assert len(data) == wire.PREFIX.size + header_len + blobs_len
    return wire.split(data[wire.PREFIX.size :], header_len)


def test_arguments_with_tensors_bytes_and_sampling_params_cross_exactly() -> None:
    kv = torch.randn(2, 3, 4, 2, 8).to(torch.bfloat16)
    params = SamplingParams(temperature=0.5, seed=2**62, stop=("\n",), stop_token_ids=(3,), logit_bias=((5, -1.5),),
                            structured=("regex", "a+"), logprobs=2)
    args = ["r1", [1, 2, 3], params, True, kv, None, [b"\x00" * 32, b"\xff" * 32], torch.empty(0, 4)]
    blobs: list[bytes] = []
    header, data = through_a_frame({"a": wire.pack(args, blobs)}, blobs)
    back = wire.unpack(header["a"], data)
    assert back[:4] == args[:4] and back[5] == None and back[6] == args[6]  # noqa: E711
    assert back[4].dtype == torch.bfloat16 and torch.equal(back[4], kv)
    assert back[7].shape == (0, 4)


def test_a_step_output_with_infinite_logprobs_crosses_exactly() -> None:
    lp = TokenLogprob(7, -0.25, [(7, -0.25), (9, float("-inf"))])
    out = RequestOutput("r", [7], "é", True, "stop", [lp], 13, 1, 8, 14, prompt_logprobs=[lp], queue_s=0.003, prefill_s=0.021)
    header, _ = through_a_frame({"o": [wire.output_to_wire(out)]}, [])
    assert wire.output_from_wire(header["o"][0]) == out


def test_what_is_not_data_does_not_cross() -> None:
    with pytest.raises(TypeError, match="cannot cross"):
        wire.pack([lambda engine: engine], [])
    with pytest.raises(ValueError, match="unknown value"):
        wire.unpack({"__reduce__": "os.system"}, bytearray())
