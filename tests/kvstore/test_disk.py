"""The disk file format: self-describing, checksummed, written atomically; bad files are dropped."""

from __future__ import annotations

import pytest

from kvmesh.kvstore.disk import CorruptBlockFile, DiskDir, decode_file, encode_file

from .conftest import SPEC, block, h

KEY = (SPEC.namespace, h("a"))


def test_a_block_file_round_trips_with_its_parent():
    raw = encode_file(KEY, h("root"), block("a", 3))
    record, back = decode_file(raw)
    assert back == block("a", 3)
    assert record.key == KEY and record.parent == h("root") and record.file_bytes == len(raw)
    assert decode_file(encode_file(KEY, None, block("a")))[0].parent is None


def test_a_file_never_holds_pickle_or_python_objects():
    raw = encode_file(KEY, None, block("a"))
    assert raw.startswith(b"KVMBLK01") and b'"block_hash"' in raw


@pytest.mark.parametrize("cut", [1, 4, 100, 600])
def test_a_truncated_file_is_corrupt(cut):
    raw = encode_file(KEY, None, block("a"))
    with pytest.raises(CorruptBlockFile):
        decode_file(raw[:-cut])


@pytest.mark.parametrize("offset", [0, 12, 200, -10, -1])
def test_a_flipped_bit_anywhere_is_corrupt(offset):
    raw = bytearray(encode_file(KEY, None, block("a")))
    raw[offset] ^= 0x10
    with pytest.raises(CorruptBlockFile):
        decode_file(bytes(raw))


def test_scan_keeps_good_files_and_deletes_bad_and_half_written_ones(tmp_path):
    disk = DiskDir(tmp_path)
    disk.write(KEY, None, block("a"))
    disk.write((SPEC.namespace, h("b")), h("a"), block("b", 1))
    bad = disk.path((SPEC.namespace, h("c")))
    bad.write_bytes(encode_file((SPEC.namespace, h("c")), None, block("c"))[:-3])
    (tmp_path / ".tmp-half.kvb").write_bytes(b"partial")
    (tmp_path / "notes.txt").write_text("left alone")

    records, dropped = disk.scan()

    assert sorted(r.key[1] for r in records) == sorted([h("a"), h("b")])
    assert dropped == 1
    assert not bad.exists() and not (tmp_path / ".tmp-half.kvb").exists()
    assert (tmp_path / "notes.txt").exists()


def test_a_file_renamed_to_another_block_is_rejected(tmp_path):
    disk = DiskDir(tmp_path)
    disk.write(KEY, None, block("a"))
    disk.path(KEY).rename(disk.path((SPEC.namespace, h("b"))))
    assert disk.scan() == ([], 1)
