"""Re-encoding stored blocks (e.g. for an int8 disk tier) with the mesh's one KV codec,
`kvmesh.runtime.kvwire` (numpy; the store needs no torch)."""

from __future__ import annotations

from kvmesh.runtime import kvwire

from .blocks import Block, Encoding, with_payload


def convert(block: Block, encoding: Encoding) -> Block:
    """`block` carried in `encoding`; RAW → INT8/INT4 quantizes, INT8/INT4 → RAW decodes to the model dtype."""
    h = block.header
    if h.encoding is encoding:
        return block
    data, scales = kvwire.transcode(block.data, block.scales, h.dtype, tuple(h.shape), int(h.encoding), int(encoding))
    return with_payload(block, encoding, data, scales)
