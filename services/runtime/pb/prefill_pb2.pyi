from . import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PrefillRequest(_message.Message):
    __slots__ = ("request_id", "prompt_token_ids", "destination", "start_block", "encoding")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    DESTINATION_FIELD_NUMBER: _ClassVar[int]
    START_BLOCK_FIELD_NUMBER: _ClassVar[int]
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    destination: _common_pb2.WorkerRef
    start_block: int
    encoding: _common_pb2.KvEncoding
    def __init__(self, request_id: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., destination: _Optional[_Union[_common_pb2.WorkerRef, _Mapping]] = ..., start_block: _Optional[int] = ..., encoding: _Optional[_Union[_common_pb2.KvEncoding, str]] = ...) -> None: ...

class PrefillResponse(_message.Message):
    __slots__ = ("num_computed_tokens", "num_cached_tokens", "blocks_pushed", "bytes_pushed")
    NUM_COMPUTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_PUSHED_FIELD_NUMBER: _ClassVar[int]
    BYTES_PUSHED_FIELD_NUMBER: _ClassVar[int]
    num_computed_tokens: int
    num_cached_tokens: int
    blocks_pushed: int
    bytes_pushed: int
    def __init__(self, num_computed_tokens: _Optional[int] = ..., num_cached_tokens: _Optional[int] = ..., blocks_pushed: _Optional[int] = ..., bytes_pushed: _Optional[int] = ...) -> None: ...
