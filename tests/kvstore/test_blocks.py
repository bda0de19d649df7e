"""Frame validation: every header field must agree with the declared model spec."""

from __future__ import annotations

import dataclasses

import pytest

from kvmesh.kvstore.blocks import Encoding, ModelSpec, check_block, check_spec, expected_lengths, make_block
from kvmesh.runtime.errors import InvalidArgument

from .conftest import SPEC, block, h, payload


def with_header(b, **changes):
    return dataclasses.replace(b, header=dataclasses.replace(b.header, **changes))


def test_a_well_formed_block_passes():
    b = block("a")
    assert check_block(SPEC, b) is b


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"block_hash": b""}, "block_hash must be 32 bytes"),
        ({"block_hash": b"x" * 31}, "block_hash must be 32 bytes"),
        ({"dtype": "bfloat16"}, "dtype"),
        ({"shape": (2, 2, 4, 2, 8)}, "shape"),
        ({"num_tokens": 3}, "num_tokens"),
        ({"layer_end": 1}, "layers"),
        ({"byte_length": 511}, "byte_length"),
        ({"scales_length": 4}, "scales_length"),
        ({"checksum": 1}, "checksum mismatch"),
        ({"encoding": Encoding.INT8}, "byte_length"),
    ],
)
def test_a_header_that_disagrees_is_invalid(changes, message):
    with pytest.raises(InvalidArgument, match=message):
        check_block(SPEC, with_header(block("a"), **changes))


def test_flipped_payload_bytes_fail_the_checksum():
    b = block("a")
    corrupted = dataclasses.replace(b, data=bytes([b.data[0] ^ 1]) + b.data[1:])
    with pytest.raises(InvalidArgument, match="checksum"):
        check_block(SPEC, corrupted)


def test_int8_and_int4_lengths_follow_the_scale_layout():
    # K scales [L, H, D] + V scales [L, n, H], float32
    scales = 4 * (2 * 2 * 4 + 2 * 4 * 2)
    assert expected_lengths(SPEC, Encoding.INT8) == (128, scales)
    assert expected_lengths(SPEC, Encoding.INT4) == (64, scales)
    data, scales_len = expected_lengths(SPEC, Encoding.INT8)
    b = make_block(SPEC, h("q"), 0, bytes(data), Encoding.INT8, bytes(scales_len))
    assert check_block(SPEC, b) is b


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"model_id": ""}, "model_id"),
        ({"dtype": "int8"}, "dtype"),
        ({"num_layers": 0}, "num_layers"),
        ({"block_size": 8}, "mesh"),
    ],
)
def test_an_incomplete_spec_is_invalid(changes, message):
    with pytest.raises(InvalidArgument, match=message):
        check_spec(dataclasses.replace(SPEC, **changes), block_size=4)


def test_a_spec_whose_blocks_are_too_big_is_invalid():
    with pytest.raises(InvalidArgument, match="over the limit"):
        check_spec(SPEC, max_block_bytes=SPEC.raw_block_bytes - 1)


def test_specs_differing_in_any_field_have_different_namespaces():
    other = ModelSpec("m", "float32", 4, 2, 2, 8)
    assert SPEC.namespace != other.namespace
    assert SPEC.namespace == ModelSpec("m", "float32", 4, 2, 2, 4).namespace
    assert len(payload("a")) == SPEC.raw_block_bytes
