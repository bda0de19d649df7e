"""What the canary reads from a MirrorRecord: is it usable, what is it about, what did production do."""

from __future__ import annotations

import hashlib
import struct

from kvmesh.runtime.pb import events_pb2

from .compare import Outcome

# NOTE: the parsed message and its bookkeeping cost more than the wire bytes; this keeps the byte
# budget honest for records with short prompts.
RECORD_OVERHEAD_BYTES = 256


def check_record(record: events_pb2.MirrorRecord) -> str | None:
    """Why a record cannot be replayed, or None when it can."""
    if not record.request_id:
        return "missing request_id"
    if not record.prompt_token_ids:
        return "empty prompt"
    if not record.HasField("sampling"):
        return "missing sampling parameters"
    return None


def content_key(record: events_pb2.MirrorRecord) -> bytes:
    """A digest of what determines the output: model, prompt tokens and sampling parameters."""
    digest = hashlib.sha256()
    digest.update(record.model.encode() + b"\x00")
    digest.update(struct.pack(f"<{len(record.prompt_token_ids)}I", *record.prompt_token_ids))
    digest.update(record.sampling.SerializeToString(deterministic=True))
    return digest.digest()


def record_size(record: events_pb2.MirrorRecord) -> int:
    """Bytes a buffered record is charged against the memory budget."""
    return record.ByteSize() + RECORD_OVERHEAD_BYTES


def production_outcome(record: events_pb2.MirrorRecord) -> Outcome:
    """The production run as the gateway saw it."""
    return Outcome(tuple(record.output_token_ids), record.ttft_s, record.tpot_s, record.error)


def is_server_error(error: str) -> bool:
    """Whether a served request's error is the server's fault (a 5xx), not the client's (4xx) or an
    abort. The gateway records API errors as "<status>: <message>" and anything else by type."""
    if not error or error in ("aborted", "cancelled"):
        return False
    status, _, _rest = error.partition(":")
    if status.isdigit():
        return int(status) >= 500
    return True
