from . import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RouteRequest(_message.Message):
    __slots__ = ("request_id", "session_id", "model", "num_prompt_tokens", "block_hashes", "max_tokens", "pool", "exclude_workers", "priority")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    NUM_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_WORKERS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    session_id: str
    model: str
    num_prompt_tokens: int
    block_hashes: _containers.RepeatedScalarFieldContainer[bytes]
    max_tokens: int
    pool: str
    exclude_workers: _containers.RepeatedScalarFieldContainer[str]
    priority: int
    def __init__(self, request_id: _Optional[str] = ..., session_id: _Optional[str] = ..., model: _Optional[str] = ..., num_prompt_tokens: _Optional[int] = ..., block_hashes: _Optional[_Iterable[bytes]] = ..., max_tokens: _Optional[int] = ..., pool: _Optional[str] = ..., exclude_workers: _Optional[_Iterable[str]] = ..., priority: _Optional[int] = ...) -> None: ...

class RouteResponse(_message.Message):
    __slots__ = ("decode", "prefill", "local_prefill", "decode_cached_blocks", "prefill_cached_blocks", "policy", "pool", "queue_wait_s")
    DECODE_FIELD_NUMBER: _ClassVar[int]
    PREFILL_FIELD_NUMBER: _ClassVar[int]
    LOCAL_PREFILL_FIELD_NUMBER: _ClassVar[int]
    DECODE_CACHED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_CACHED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    QUEUE_WAIT_S_FIELD_NUMBER: _ClassVar[int]
    decode: _common_pb2.WorkerRef
    prefill: _common_pb2.WorkerRef
    local_prefill: bool
    decode_cached_blocks: int
    prefill_cached_blocks: int
    policy: str
    pool: str
    queue_wait_s: float
    def __init__(self, decode: _Optional[_Union[_common_pb2.WorkerRef, _Mapping]] = ..., prefill: _Optional[_Union[_common_pb2.WorkerRef, _Mapping]] = ..., local_prefill: bool = ..., decode_cached_blocks: _Optional[int] = ..., prefill_cached_blocks: _Optional[int] = ..., policy: _Optional[str] = ..., pool: _Optional[str] = ..., queue_wait_s: _Optional[float] = ...) -> None: ...

class CompleteRequest(_message.Message):
    __slots__ = ("request_id", "status")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    status: str
    def __init__(self, request_id: _Optional[str] = ..., status: _Optional[str] = ...) -> None: ...

class CompleteResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StreamedRoute(_message.Message):
    __slots__ = ("request", "trace_context", "timeout_s")
    class TraceContextEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    TRACE_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    request: RouteRequest
    trace_context: _containers.ScalarMap[str, str]
    timeout_s: float
    def __init__(self, request: _Optional[_Union[RouteRequest, _Mapping]] = ..., trace_context: _Optional[_Mapping[str, str]] = ..., timeout_s: _Optional[float] = ...) -> None: ...

class RouteStreamRequest(_message.Message):
    __slots__ = ("route", "complete", "batch")
    ROUTE_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    route: StreamedRoute
    complete: CompleteRequest
    batch: RouteStreamBatch
    def __init__(self, route: _Optional[_Union[StreamedRoute, _Mapping]] = ..., complete: _Optional[_Union[CompleteRequest, _Mapping]] = ..., batch: _Optional[_Union[RouteStreamBatch, _Mapping]] = ...) -> None: ...

class RouteStreamBatch(_message.Message):
    __slots__ = ("frames",)
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    frames: _containers.RepeatedCompositeFieldContainer[RouteStreamRequest]
    def __init__(self, frames: _Optional[_Iterable[_Union[RouteStreamRequest, _Mapping]]] = ...) -> None: ...

class RouteStreamResponse(_message.Message):
    __slots__ = ("request_id", "route", "error_code", "error_message", "retry_after_s", "batch")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ROUTE_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_S_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    route: RouteResponse
    error_code: int
    error_message: str
    retry_after_s: float
    batch: _containers.RepeatedCompositeFieldContainer[RouteStreamResponse]
    def __init__(self, request_id: _Optional[str] = ..., route: _Optional[_Union[RouteResponse, _Mapping]] = ..., error_code: _Optional[int] = ..., error_message: _Optional[str] = ..., retry_after_s: _Optional[float] = ..., batch: _Optional[_Iterable[_Union[RouteStreamResponse, _Mapping]]] = ...) -> None: ...

class ListWorkersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkerStatus(_message.Message):
    __slots__ = ("worker_id", "role", "endpoint", "pool", "model", "num_running", "num_waiting", "kv_blocks_total", "kv_blocks_free", "last_seen_age_s", "draining", "inflight", "max_model_len", "warming")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    NUM_RUNNING_FIELD_NUMBER: _ClassVar[int]
    NUM_WAITING_FIELD_NUMBER: _ClassVar[int]
    KV_BLOCKS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    KV_BLOCKS_FREE_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_AGE_S_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    WARMING_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    role: _common_pb2.WorkerRole
    endpoint: str
    pool: str
    model: str
    num_running: int
    num_waiting: int
    kv_blocks_total: int
    kv_blocks_free: int
    last_seen_age_s: float
    draining: bool
    inflight: int
    max_model_len: int
    warming: bool
    def __init__(self, worker_id: _Optional[str] = ..., role: _Optional[_Union[_common_pb2.WorkerRole, str]] = ..., endpoint: _Optional[str] = ..., pool: _Optional[str] = ..., model: _Optional[str] = ..., num_running: _Optional[int] = ..., num_waiting: _Optional[int] = ..., kv_blocks_total: _Optional[int] = ..., kv_blocks_free: _Optional[int] = ..., last_seen_age_s: _Optional[float] = ..., draining: bool = ..., inflight: _Optional[int] = ..., max_model_len: _Optional[int] = ..., warming: bool = ...) -> None: ...

class ListWorkersResponse(_message.Message):
    __slots__ = ("workers", "production_pool", "canary_pool", "canary_weight")
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    PRODUCTION_POOL_FIELD_NUMBER: _ClassVar[int]
    CANARY_POOL_FIELD_NUMBER: _ClassVar[int]
    CANARY_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    workers: _containers.RepeatedCompositeFieldContainer[WorkerStatus]
    production_pool: str
    canary_pool: str
    canary_weight: float
    def __init__(self, workers: _Optional[_Iterable[_Union[WorkerStatus, _Mapping]]] = ..., production_pool: _Optional[str] = ..., canary_pool: _Optional[str] = ..., canary_weight: _Optional[float] = ...) -> None: ...

class SetProductionPoolRequest(_message.Message):
    __slots__ = ("pool", "canary_pool", "canary_weight")
    POOL_FIELD_NUMBER: _ClassVar[int]
    CANARY_POOL_FIELD_NUMBER: _ClassVar[int]
    CANARY_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    pool: str
    canary_pool: str
    canary_weight: float
    def __init__(self, pool: _Optional[str] = ..., canary_pool: _Optional[str] = ..., canary_weight: _Optional[float] = ...) -> None: ...

class SetProductionPoolResponse(_message.Message):
    __slots__ = ("previous_pool",)
    PREVIOUS_POOL_FIELD_NUMBER: _ClassVar[int]
    previous_pool: str
    def __init__(self, previous_pool: _Optional[str] = ...) -> None: ...
