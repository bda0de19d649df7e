from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Verdict(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    VERDICT_UNSPECIFIED: _ClassVar[Verdict]
    VERDICT_COLLECTING: _ClassVar[Verdict]
    VERDICT_PASS: _ClassVar[Verdict]
    VERDICT_FAIL: _ClassVar[Verdict]
VERDICT_UNSPECIFIED: Verdict
VERDICT_COLLECTING: Verdict
VERDICT_PASS: Verdict
VERDICT_FAIL: Verdict

class GetReportRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class LatencyDelta(_message.Message):
    __slots__ = ("production_p50_s", "production_p99_s", "candidate_p50_s", "candidate_p99_s")
    PRODUCTION_P50_S_FIELD_NUMBER: _ClassVar[int]
    PRODUCTION_P99_S_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_P50_S_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_P99_S_FIELD_NUMBER: _ClassVar[int]
    production_p50_s: float
    production_p99_s: float
    candidate_p50_s: float
    candidate_p99_s: float
    def __init__(self, production_p50_s: _Optional[float] = ..., production_p99_s: _Optional[float] = ..., candidate_p50_s: _Optional[float] = ..., candidate_p99_s: _Optional[float] = ...) -> None: ...

class CanaryReport(_message.Message):
    __slots__ = ("verdict", "reason", "samples", "exact_match_rate", "token_agreement", "noise_floor_agreement", "mean_first_divergence", "ttft", "tpot", "production_error_rate", "candidate_error_rate", "mirror_received", "mirror_dropped", "mirror_malformed", "production_pool", "candidate_pool", "noise_samples", "mirror_duplicates", "buffered", "promoted_weight", "mirror_candidate_served", "warmup_left")
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    EXACT_MATCH_RATE_FIELD_NUMBER: _ClassVar[int]
    TOKEN_AGREEMENT_FIELD_NUMBER: _ClassVar[int]
    NOISE_FLOOR_AGREEMENT_FIELD_NUMBER: _ClassVar[int]
    MEAN_FIRST_DIVERGENCE_FIELD_NUMBER: _ClassVar[int]
    TTFT_FIELD_NUMBER: _ClassVar[int]
    TPOT_FIELD_NUMBER: _ClassVar[int]
    PRODUCTION_ERROR_RATE_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_ERROR_RATE_FIELD_NUMBER: _ClassVar[int]
    MIRROR_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    MIRROR_DROPPED_FIELD_NUMBER: _ClassVar[int]
    MIRROR_MALFORMED_FIELD_NUMBER: _ClassVar[int]
    PRODUCTION_POOL_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_POOL_FIELD_NUMBER: _ClassVar[int]
    NOISE_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    MIRROR_DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    BUFFERED_FIELD_NUMBER: _ClassVar[int]
    PROMOTED_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    MIRROR_CANDIDATE_SERVED_FIELD_NUMBER: _ClassVar[int]
    WARMUP_LEFT_FIELD_NUMBER: _ClassVar[int]
    verdict: Verdict
    reason: str
    samples: int
    exact_match_rate: float
    token_agreement: float
    noise_floor_agreement: float
    mean_first_divergence: float
    ttft: LatencyDelta
    tpot: LatencyDelta
    production_error_rate: float
    candidate_error_rate: float
    mirror_received: int
    mirror_dropped: int
    mirror_malformed: int
    production_pool: str
    candidate_pool: str
    noise_samples: int
    mirror_duplicates: int
    buffered: int
    promoted_weight: float
    mirror_candidate_served: int
    warmup_left: int
    def __init__(self, verdict: _Optional[_Union[Verdict, str]] = ..., reason: _Optional[str] = ..., samples: _Optional[int] = ..., exact_match_rate: _Optional[float] = ..., token_agreement: _Optional[float] = ..., noise_floor_agreement: _Optional[float] = ..., mean_first_divergence: _Optional[float] = ..., ttft: _Optional[_Union[LatencyDelta, _Mapping]] = ..., tpot: _Optional[_Union[LatencyDelta, _Mapping]] = ..., production_error_rate: _Optional[float] = ..., candidate_error_rate: _Optional[float] = ..., mirror_received: _Optional[int] = ..., mirror_dropped: _Optional[int] = ..., mirror_malformed: _Optional[int] = ..., production_pool: _Optional[str] = ..., candidate_pool: _Optional[str] = ..., noise_samples: _Optional[int] = ..., mirror_duplicates: _Optional[int] = ..., buffered: _Optional[int] = ..., promoted_weight: _Optional[float] = ..., mirror_candidate_served: _Optional[int] = ..., warmup_left: _Optional[int] = ...) -> None: ...

class PromoteRequest(_message.Message):
    __slots__ = ("weight",)
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    weight: float
    def __init__(self, weight: _Optional[float] = ...) -> None: ...

class PromoteResponse(_message.Message):
    __slots__ = ("production_pool",)
    PRODUCTION_POOL_FIELD_NUMBER: _ClassVar[int]
    production_pool: str
    def __init__(self, production_pool: _Optional[str] = ...) -> None: ...

class RollbackRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RollbackResponse(_message.Message):
    __slots__ = ("production_pool",)
    PRODUCTION_POOL_FIELD_NUMBER: _ClassVar[int]
    production_pool: str
    def __init__(self, production_pool: _Optional[str] = ...) -> None: ...
