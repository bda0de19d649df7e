from . import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Heartbeat(_message.Message):
    __slots__ = ("worker_id", "role", "endpoint", "pool", "model", "block_size", "num_running", "num_waiting", "kv_blocks_total", "kv_blocks_free", "max_num_seqs", "timestamp", "started_at", "draining", "kv_event_seq", "live_requests", "max_model_len", "engine_progress", "reports_progress")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    NUM_RUNNING_FIELD_NUMBER: _ClassVar[int]
    NUM_WAITING_FIELD_NUMBER: _ClassVar[int]
    KV_BLOCKS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    KV_BLOCKS_FREE_FIELD_NUMBER: _ClassVar[int]
    MAX_NUM_SEQS_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    KV_EVENT_SEQ_FIELD_NUMBER: _ClassVar[int]
    LIVE_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    ENGINE_PROGRESS_FIELD_NUMBER: _ClassVar[int]
    REPORTS_PROGRESS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    role: _common_pb2.WorkerRole
    endpoint: str
    pool: str
    model: str
    block_size: int
    num_running: int
    num_waiting: int
    kv_blocks_total: int
    kv_blocks_free: int
    max_num_seqs: int
    timestamp: float
    started_at: float
    draining: bool
    kv_event_seq: int
    live_requests: LiveRequests
    max_model_len: int
    engine_progress: int
    reports_progress: bool
    def __init__(self, worker_id: _Optional[str] = ..., role: _Optional[_Union[_common_pb2.WorkerRole, str]] = ..., endpoint: _Optional[str] = ..., pool: _Optional[str] = ..., model: _Optional[str] = ..., block_size: _Optional[int] = ..., num_running: _Optional[int] = ..., num_waiting: _Optional[int] = ..., kv_blocks_total: _Optional[int] = ..., kv_blocks_free: _Optional[int] = ..., max_num_seqs: _Optional[int] = ..., timestamp: _Optional[float] = ..., started_at: _Optional[float] = ..., draining: bool = ..., kv_event_seq: _Optional[int] = ..., live_requests: _Optional[_Union[LiveRequests, _Mapping]] = ..., max_model_len: _Optional[int] = ..., engine_progress: _Optional[int] = ..., reports_progress: bool = ...) -> None: ...

class LiveRequests(_message.Message):
    __slots__ = ("request_ids",)
    REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    request_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, request_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class BlockStored(_message.Message):
    __slots__ = ("block_hashes", "parent_hash")
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    PARENT_HASH_FIELD_NUMBER: _ClassVar[int]
    block_hashes: _containers.RepeatedScalarFieldContainer[bytes]
    parent_hash: bytes
    def __init__(self, block_hashes: _Optional[_Iterable[bytes]] = ..., parent_hash: _Optional[bytes] = ...) -> None: ...

class BlockRemoved(_message.Message):
    __slots__ = ("block_hashes",)
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    block_hashes: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, block_hashes: _Optional[_Iterable[bytes]] = ...) -> None: ...

class AllCleared(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class KvEvent(_message.Message):
    __slots__ = ("stored", "removed", "cleared")
    STORED_FIELD_NUMBER: _ClassVar[int]
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    CLEARED_FIELD_NUMBER: _ClassVar[int]
    stored: BlockStored
    removed: BlockRemoved
    cleared: AllCleared
    def __init__(self, stored: _Optional[_Union[BlockStored, _Mapping]] = ..., removed: _Optional[_Union[BlockRemoved, _Mapping]] = ..., cleared: _Optional[_Union[AllCleared, _Mapping]] = ...) -> None: ...

class KvEventBatch(_message.Message):
    __slots__ = ("worker_id", "seq", "timestamp", "events")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    seq: int
    timestamp: float
    events: _containers.RepeatedCompositeFieldContainer[KvEvent]
    def __init__(self, worker_id: _Optional[str] = ..., seq: _Optional[int] = ..., timestamp: _Optional[float] = ..., events: _Optional[_Iterable[_Union[KvEvent, _Mapping]]] = ...) -> None: ...

class KvReplayRequest(_message.Message):
    __slots__ = ("from_seq", "dump_id", "chunk")
    FROM_SEQ_FIELD_NUMBER: _ClassVar[int]
    DUMP_ID_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    from_seq: int
    dump_id: str
    chunk: int
    def __init__(self, from_seq: _Optional[int] = ..., dump_id: _Optional[str] = ..., chunk: _Optional[int] = ...) -> None: ...

class KvReplayReply(_message.Message):
    __slots__ = ("batches", "full_dump", "held", "seq", "dump_id", "chunk", "num_chunks")
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    FULL_DUMP_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    DUMP_ID_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    NUM_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    batches: _containers.RepeatedCompositeFieldContainer[KvEventBatch]
    full_dump: bool
    held: _containers.RepeatedScalarFieldContainer[bytes]
    seq: int
    dump_id: str
    chunk: int
    num_chunks: int
    def __init__(self, batches: _Optional[_Iterable[_Union[KvEventBatch, _Mapping]]] = ..., full_dump: bool = ..., held: _Optional[_Iterable[bytes]] = ..., seq: _Optional[int] = ..., dump_id: _Optional[str] = ..., chunk: _Optional[int] = ..., num_chunks: _Optional[int] = ...) -> None: ...

class MirrorRecord(_message.Message):
    __slots__ = ("request_id", "model", "prompt_token_ids", "sampling", "output_token_ids", "finish_reason", "ttft_s", "tpot_s", "error", "timestamp", "session_id", "pool")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    TTFT_S_FIELD_NUMBER: _ClassVar[int]
    TPOT_S_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    model: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    sampling: _common_pb2.SamplingParams
    output_token_ids: _containers.RepeatedScalarFieldContainer[int]
    finish_reason: str
    ttft_s: float
    tpot_s: float
    error: str
    timestamp: float
    session_id: str
    pool: str
    def __init__(self, request_id: _Optional[str] = ..., model: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., output_token_ids: _Optional[_Iterable[int]] = ..., finish_reason: _Optional[str] = ..., ttft_s: _Optional[float] = ..., tpot_s: _Optional[float] = ..., error: _Optional[str] = ..., timestamp: _Optional[float] = ..., session_id: _Optional[str] = ..., pool: _Optional[str] = ...) -> None: ...

class PrewarmPrefix(_message.Message):
    __slots__ = ("block_hashes",)
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    block_hashes: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, block_hashes: _Optional[_Iterable[bytes]] = ...) -> None: ...

class PrewarmRequest(_message.Message):
    __slots__ = ("prefixes", "num_blocks")
    PREFIXES_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    prefixes: _containers.RepeatedCompositeFieldContainer[PrewarmPrefix]
    num_blocks: int
    def __init__(self, prefixes: _Optional[_Iterable[_Union[PrewarmPrefix, _Mapping]]] = ..., num_blocks: _Optional[int] = ...) -> None: ...

class PrewarmReply(_message.Message):
    __slots__ = ("blocks_requested", "blocks_fetched", "blocks_cached", "seconds", "error")
    BLOCKS_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FETCHED_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_CACHED_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    blocks_requested: int
    blocks_fetched: int
    blocks_cached: int
    seconds: float
    error: str
    def __init__(self, blocks_requested: _Optional[int] = ..., blocks_fetched: _Optional[int] = ..., blocks_cached: _Optional[int] = ..., seconds: _Optional[float] = ..., error: _Optional[str] = ...) -> None: ...

class SchedulerHeartbeat(_message.Message):
    __slots__ = ("replica_id", "endpoint", "started_at", "timestamp", "slots", "active", "production_pool", "canary_pool", "canary_weight", "split_set_at")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    PRODUCTION_POOL_FIELD_NUMBER: _ClassVar[int]
    CANARY_POOL_FIELD_NUMBER: _ClassVar[int]
    CANARY_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    SPLIT_SET_AT_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    endpoint: str
    started_at: float
    timestamp: float
    slots: int
    active: int
    production_pool: str
    canary_pool: str
    canary_weight: float
    split_set_at: float
    def __init__(self, replica_id: _Optional[str] = ..., endpoint: _Optional[str] = ..., started_at: _Optional[float] = ..., timestamp: _Optional[float] = ..., slots: _Optional[int] = ..., active: _Optional[int] = ..., production_pool: _Optional[str] = ..., canary_pool: _Optional[str] = ..., canary_weight: _Optional[float] = ..., split_set_at: _Optional[float] = ...) -> None: ...

class WorkerPrediction(_message.Message):
    __slots__ = ("worker_id", "block_hashes")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    block_hashes: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, worker_id: _Optional[str] = ..., block_hashes: _Optional[_Iterable[bytes]] = ...) -> None: ...

class RoutePredictions(_message.Message):
    __slots__ = ("replica_id", "request_id", "ttl_s", "predictions", "decode_worker", "prefill_worker", "prefill_s")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TTL_S_FIELD_NUMBER: _ClassVar[int]
    PREDICTIONS_FIELD_NUMBER: _ClassVar[int]
    DECODE_WORKER_FIELD_NUMBER: _ClassVar[int]
    PREFILL_WORKER_FIELD_NUMBER: _ClassVar[int]
    PREFILL_S_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    request_id: str
    ttl_s: float
    predictions: _containers.RepeatedCompositeFieldContainer[WorkerPrediction]
    decode_worker: str
    prefill_worker: str
    prefill_s: float
    def __init__(self, replica_id: _Optional[str] = ..., request_id: _Optional[str] = ..., ttl_s: _Optional[float] = ..., predictions: _Optional[_Iterable[_Union[WorkerPrediction, _Mapping]]] = ..., decode_worker: _Optional[str] = ..., prefill_worker: _Optional[str] = ..., prefill_s: _Optional[float] = ...) -> None: ...

class RouteCompleted(_message.Message):
    __slots__ = ("replica_id", "request_id", "decode_worker")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    DECODE_WORKER_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    request_id: str
    decode_worker: str
    def __init__(self, replica_id: _Optional[str] = ..., request_id: _Optional[str] = ..., decode_worker: _Optional[str] = ...) -> None: ...
