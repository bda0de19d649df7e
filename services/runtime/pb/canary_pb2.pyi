from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Verdict(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    VERDICT_UNSPECIFIED: _ClassVar[Verdict]
    VERDICT_COLLECTING: _ClassVar[Verdict]
    VERDICT_PASS: _ClassVar[Verdict]
    VERDICT_FAIL: _ClassVar[Verdict]

class RolloutState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROLLOUT_STATE_UNSPECIFIED: _ClassVar[RolloutState]
    ROLLOUT_STATE_IDLE: _ClassVar[RolloutState]
    ROLLOUT_STATE_RUNNING: _ClassVar[RolloutState]
    ROLLOUT_STATE_COMPLETED: _ClassVar[RolloutState]
    ROLLOUT_STATE_ROLLED_BACK: _ClassVar[RolloutState]
    ROLLOUT_STATE_ABORTED: _ClassVar[RolloutState]

class StepState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STEP_STATE_UNSPECIFIED: _ClassVar[StepState]
    STEP_STATE_PENDING: _ClassVar[StepState]
    STEP_STATE_HOLDING: _ClassVar[StepState]
    STEP_STATE_PASSED: _ClassVar[StepState]
    STEP_STATE_FAILED: _ClassVar[StepState]
VERDICT_UNSPECIFIED: Verdict
VERDICT_COLLECTING: Verdict
VERDICT_PASS: Verdict
VERDICT_FAIL: Verdict
ROLLOUT_STATE_UNSPECIFIED: RolloutState
ROLLOUT_STATE_IDLE: RolloutState
ROLLOUT_STATE_RUNNING: RolloutState
ROLLOUT_STATE_COMPLETED: RolloutState
ROLLOUT_STATE_ROLLED_BACK: RolloutState
ROLLOUT_STATE_ABORTED: RolloutState
STEP_STATE_UNSPECIFIED: StepState
STEP_STATE_PENDING: StepState
STEP_STATE_HOLDING: StepState
STEP_STATE_PASSED: StepState
STEP_STATE_FAILED: StepState

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

class StartRolloutRequest(_message.Message):
    __slots__ = ("steps", "min_samples", "min_seconds", "min_served", "judge_latency")
    STEPS_FIELD_NUMBER: _ClassVar[int]
    MIN_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    MIN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MIN_SERVED_FIELD_NUMBER: _ClassVar[int]
    JUDGE_LATENCY_FIELD_NUMBER: _ClassVar[int]
    steps: _containers.RepeatedScalarFieldContainer[float]
    min_samples: int
    min_seconds: float
    min_served: int
    judge_latency: bool
    def __init__(self, steps: _Optional[_Iterable[float]] = ..., min_samples: _Optional[int] = ..., min_seconds: _Optional[float] = ..., min_served: _Optional[int] = ..., judge_latency: bool = ...) -> None: ...

class GetRolloutRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AbortRolloutRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RolloutCheck(_message.Message):
    __slots__ = ("name", "value", "limit", "passed", "comparable", "detail")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    PASSED_FIELD_NUMBER: _ClassVar[int]
    COMPARABLE_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: float
    limit: float
    passed: bool
    comparable: bool
    detail: str
    def __init__(self, name: _Optional[str] = ..., value: _Optional[float] = ..., limit: _Optional[float] = ..., passed: bool = ..., comparable: bool = ..., detail: _Optional[str] = ...) -> None: ...

class RolloutStep(_message.Message):
    __slots__ = ("weight", "state", "reason", "samples", "served", "started_at", "finished_at", "checks")
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    SERVED_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    CHECKS_FIELD_NUMBER: _ClassVar[int]
    weight: float
    state: StepState
    reason: str
    samples: int
    served: int
    started_at: float
    finished_at: float
    checks: _containers.RepeatedCompositeFieldContainer[RolloutCheck]
    def __init__(self, weight: _Optional[float] = ..., state: _Optional[_Union[StepState, str]] = ..., reason: _Optional[str] = ..., samples: _Optional[int] = ..., served: _Optional[int] = ..., started_at: _Optional[float] = ..., finished_at: _Optional[float] = ..., checks: _Optional[_Iterable[_Union[RolloutCheck, _Mapping]]] = ...) -> None: ...

class RolloutStatus(_message.Message):
    __slots__ = ("state", "step", "weight", "reason", "steps", "resumed", "latency_comparable", "applied", "min_samples", "min_seconds", "min_served", "judge_latency")
    STATE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    RESUMED_FIELD_NUMBER: _ClassVar[int]
    LATENCY_COMPARABLE_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    MIN_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    MIN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MIN_SERVED_FIELD_NUMBER: _ClassVar[int]
    JUDGE_LATENCY_FIELD_NUMBER: _ClassVar[int]
    state: RolloutState
    step: int
    weight: float
    reason: str
    steps: _containers.RepeatedCompositeFieldContainer[RolloutStep]
    resumed: int
    latency_comparable: bool
    applied: bool
    min_samples: int
    min_seconds: float
    min_served: int
    judge_latency: bool
    def __init__(self, state: _Optional[_Union[RolloutState, str]] = ..., step: _Optional[int] = ..., weight: _Optional[float] = ..., reason: _Optional[str] = ..., steps: _Optional[_Iterable[_Union[RolloutStep, _Mapping]]] = ..., resumed: _Optional[int] = ..., latency_comparable: bool = ..., applied: bool = ..., min_samples: _Optional[int] = ..., min_seconds: _Optional[float] = ..., min_served: _Optional[int] = ..., judge_latency: bool = ...) -> None: ...
