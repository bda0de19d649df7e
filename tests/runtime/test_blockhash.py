import hashlib
import struct

import pytest

from kvmesh.runtime.blockhash import BlockHasher, chain_hashes, hash_block, model_fingerprint, resolve_dtype, root_hash


def test_first_block_hash_follows_the_contract():
    tokens = list(range(16))
    root = hashlib.sha256(b"kvmesh/v1" + model_fingerprint("m", "float32", 16)).digest()
    expected = hashlib.sha256(root + struct.pack("<16I", *tokens)).digest()
    assert BlockHasher("m", "float32", 16).hashes(tokens) == [expected]


def test_only_full_blocks_are_hashed_and_they_chain():
    hasher = BlockHasher("m", "float32", 4)
    hashes = hasher.hashes([1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert len(hashes) == 2
    assert hashes[1] == hash_block(hashes[0], [5, 6, 7, 8])
    assert hasher.extend(None, [1, 2, 3, 4]) == hashes[0]


def test_same_block_under_a_different_prefix_differs():
    hasher = BlockHasher("m", "float32", 2)
    assert hasher.hashes([1, 2, 9, 9])[1] != hasher.hashes([3, 4, 9, 9])[1]


@pytest.mark.parametrize("other", [("m2", "float32", 4), ("m", "bfloat16", 4), ("m", "float32", 8)])
def test_model_dtype_and_block_size_change_the_root(other):
    assert BlockHasher("m", "float32", 4).root != BlockHasher(*other).root


def test_extra_keys_are_tagged_not_concatenated():
    root = root_hash(b"x")
    assert chain_hashes(root, [1, 2], 2, ["ab"]) != chain_hashes(root, [1, 2], 2, ["a", "b"])
    assert chain_hashes(root, [1, 2], 2, ["lora:7"]) != chain_hashes(root, [1, 2], 2)


def test_resolve_dtype():
    assert resolve_dtype("auto", "bfloat16") == "bfloat16"
    assert resolve_dtype("auto", None) == "float32"
    assert resolve_dtype("bf16", "float32") == "bfloat16"
    with pytest.raises(ValueError, match="unsupported dtype 'int3'"):
        resolve_dtype("int3", None)
