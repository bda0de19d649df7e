from . import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LookupRequest(_message.Message):
    __slots__ = ("spec", "block_hashes", "lease_s")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    LEASE_S_FIELD_NUMBER: _ClassVar[int]
    spec: _common_pb2.ModelSpec
    block_hashes: _containers.RepeatedScalarFieldContainer[bytes]
    lease_s: float
    def __init__(self, spec: _Optional[_Union[_common_pb2.ModelSpec, _Mapping]] = ..., block_hashes: _Optional[_Iterable[bytes]] = ..., lease_s: _Optional[float] = ...) -> None: ...

class LookupResponse(_message.Message):
    __slots__ = ("num_blocks", "lease_id", "lease_expires_in_s")
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRES_IN_S_FIELD_NUMBER: _ClassVar[int]
    num_blocks: int
    lease_id: str
    lease_expires_in_s: float
    def __init__(self, num_blocks: _Optional[int] = ..., lease_id: _Optional[str] = ..., lease_expires_in_s: _Optional[float] = ...) -> None: ...

class HashChain(_message.Message):
    __slots__ = ("block_hashes",)
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    block_hashes: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, block_hashes: _Optional[_Iterable[bytes]] = ...) -> None: ...

class LookupChainsRequest(_message.Message):
    __slots__ = ("spec", "chains", "lease_s")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    CHAINS_FIELD_NUMBER: _ClassVar[int]
    LEASE_S_FIELD_NUMBER: _ClassVar[int]
    spec: _common_pb2.ModelSpec
    chains: _containers.RepeatedCompositeFieldContainer[HashChain]
    lease_s: float
    def __init__(self, spec: _Optional[_Union[_common_pb2.ModelSpec, _Mapping]] = ..., chains: _Optional[_Iterable[_Union[HashChain, _Mapping]]] = ..., lease_s: _Optional[float] = ...) -> None: ...

class LookupChainsResponse(_message.Message):
    __slots__ = ("chains",)
    CHAINS_FIELD_NUMBER: _ClassVar[int]
    chains: _containers.RepeatedCompositeFieldContainer[LookupResponse]
    def __init__(self, chains: _Optional[_Iterable[_Union[LookupResponse, _Mapping]]] = ...) -> None: ...

class GetRequest(_message.Message):
    __slots__ = ("spec", "block_hashes", "lease_id", "encoding")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    spec: _common_pb2.ModelSpec
    block_hashes: _containers.RepeatedScalarFieldContainer[bytes]
    lease_id: str
    encoding: _common_pb2.KvEncoding
    def __init__(self, spec: _Optional[_Union[_common_pb2.ModelSpec, _Mapping]] = ..., block_hashes: _Optional[_Iterable[bytes]] = ..., lease_id: _Optional[str] = ..., encoding: _Optional[_Union[_common_pb2.KvEncoding, str]] = ...) -> None: ...

class PutOpen(_message.Message):
    __slots__ = ("spec", "producer_id", "parent_hash")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_HASH_FIELD_NUMBER: _ClassVar[int]
    spec: _common_pb2.ModelSpec
    producer_id: str
    parent_hash: bytes
    def __init__(self, spec: _Optional[_Union[_common_pb2.ModelSpec, _Mapping]] = ..., producer_id: _Optional[str] = ..., parent_hash: _Optional[bytes] = ...) -> None: ...

class PutCommit(_message.Message):
    __slots__ = ("num_blocks",)
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    num_blocks: int
    def __init__(self, num_blocks: _Optional[int] = ...) -> None: ...

class KvBlockBatch(_message.Message):
    __slots__ = ("blocks", "new_chain", "parent_hash")
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NEW_CHAIN_FIELD_NUMBER: _ClassVar[int]
    PARENT_HASH_FIELD_NUMBER: _ClassVar[int]
    blocks: _containers.RepeatedCompositeFieldContainer[_common_pb2.KvBlock]
    new_chain: bool
    parent_hash: bytes
    def __init__(self, blocks: _Optional[_Iterable[_Union[_common_pb2.KvBlock, _Mapping]]] = ..., new_chain: bool = ..., parent_hash: _Optional[bytes] = ...) -> None: ...

class KvBlockRun(_message.Message):
    __slots__ = ("block_hashes", "checksums", "first_index", "encoding", "data", "scales", "new_chain", "parent_hash")
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    CHECKSUMS_FIELD_NUMBER: _ClassVar[int]
    FIRST_INDEX_FIELD_NUMBER: _ClassVar[int]
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    SCALES_FIELD_NUMBER: _ClassVar[int]
    NEW_CHAIN_FIELD_NUMBER: _ClassVar[int]
    PARENT_HASH_FIELD_NUMBER: _ClassVar[int]
    block_hashes: _containers.RepeatedScalarFieldContainer[bytes]
    checksums: _containers.RepeatedScalarFieldContainer[int]
    first_index: int
    encoding: _common_pb2.KvEncoding
    data: bytes
    scales: bytes
    new_chain: bool
    parent_hash: bytes
    def __init__(self, block_hashes: _Optional[_Iterable[bytes]] = ..., checksums: _Optional[_Iterable[int]] = ..., first_index: _Optional[int] = ..., encoding: _Optional[_Union[_common_pb2.KvEncoding, str]] = ..., data: _Optional[bytes] = ..., scales: _Optional[bytes] = ..., new_chain: bool = ..., parent_hash: _Optional[bytes] = ...) -> None: ...

class KvBlockRuns(_message.Message):
    __slots__ = ("runs",)
    RUNS_FIELD_NUMBER: _ClassVar[int]
    runs: _containers.RepeatedCompositeFieldContainer[KvBlockRun]
    def __init__(self, runs: _Optional[_Iterable[_Union[KvBlockRun, _Mapping]]] = ...) -> None: ...

class PutMessage(_message.Message):
    __slots__ = ("open", "block", "commit", "blocks", "runs")
    OPEN_FIELD_NUMBER: _ClassVar[int]
    BLOCK_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    open: PutOpen
    block: _common_pb2.KvBlock
    commit: PutCommit
    blocks: KvBlockBatch
    runs: KvBlockRuns
    def __init__(self, open: _Optional[_Union[PutOpen, _Mapping]] = ..., block: _Optional[_Union[_common_pb2.KvBlock, _Mapping]] = ..., commit: _Optional[_Union[PutCommit, _Mapping]] = ..., blocks: _Optional[_Union[KvBlockBatch, _Mapping]] = ..., runs: _Optional[_Union[KvBlockRuns, _Mapping]] = ...) -> None: ...

class PutResponse(_message.Message):
    __slots__ = ("stored", "duplicates")
    STORED_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    stored: int
    duplicates: int
    def __init__(self, stored: _Optional[int] = ..., duplicates: _Optional[int] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TierStats(_message.Message):
    __slots__ = ("name", "blocks", "bytes", "capacity_bytes", "evictions")
    NAME_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    EVICTIONS_FIELD_NUMBER: _ClassVar[int]
    name: str
    blocks: int
    bytes: int
    capacity_bytes: int
    evictions: int
    def __init__(self, name: _Optional[str] = ..., blocks: _Optional[int] = ..., bytes: _Optional[int] = ..., capacity_bytes: _Optional[int] = ..., evictions: _Optional[int] = ...) -> None: ...

class StatsResponse(_message.Message):
    __slots__ = ("tiers", "lookups", "lookup_hit_blocks", "lookup_query_blocks", "puts", "gets", "lookup_calls")
    TIERS_FIELD_NUMBER: _ClassVar[int]
    LOOKUPS_FIELD_NUMBER: _ClassVar[int]
    LOOKUP_HIT_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    LOOKUP_QUERY_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    PUTS_FIELD_NUMBER: _ClassVar[int]
    GETS_FIELD_NUMBER: _ClassVar[int]
    LOOKUP_CALLS_FIELD_NUMBER: _ClassVar[int]
    tiers: _containers.RepeatedCompositeFieldContainer[TierStats]
    lookups: int
    lookup_hit_blocks: int
    lookup_query_blocks: int
    puts: int
    gets: int
    lookup_calls: int
    def __init__(self, tiers: _Optional[_Iterable[_Union[TierStats, _Mapping]]] = ..., lookups: _Optional[int] = ..., lookup_hit_blocks: _Optional[int] = ..., lookup_query_blocks: _Optional[int] = ..., puts: _Optional[int] = ..., gets: _Optional[int] = ..., lookup_calls: _Optional[int] = ...) -> None: ...
