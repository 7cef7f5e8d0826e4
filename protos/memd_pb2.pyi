from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class BufferDesc(_message.Message):
    __slots__ = ("name", "backend", "ipc_handle", "shm_name", "dtype", "shape", "strides", "offset_bytes", "size_bytes", "device_id", "device_uuid", "rank", "shared")
    NAME_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    IPC_HANDLE_FIELD_NUMBER: _ClassVar[int]
    SHM_NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    STRIDES_FIELD_NUMBER: _ClassVar[int]
    OFFSET_BYTES_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    DEVICE_UUID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    SHARED_FIELD_NUMBER: _ClassVar[int]
    name: str
    backend: str
    ipc_handle: bytes
    shm_name: str
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    strides: _containers.RepeatedScalarFieldContainer[int]
    offset_bytes: int
    size_bytes: int
    device_id: int
    device_uuid: str
    rank: int
    shared: bool
    def __init__(self, name: _Optional[str] = ..., backend: _Optional[str] = ..., ipc_handle: _Optional[bytes] = ..., shm_name: _Optional[str] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., strides: _Optional[_Iterable[int]] = ..., offset_bytes: _Optional[int] = ..., size_bytes: _Optional[int] = ..., device_id: _Optional[int] = ..., device_uuid: _Optional[str] = ..., rank: _Optional[int] = ..., shared: _Optional[bool] = ...) -> None: ...

class PoolGeometry(_message.Message):
    __slots__ = ("layers", "kv_heads", "head_dim", "tokens", "rows", "bytes", "bytes_per_token")
    LAYERS_FIELD_NUMBER: _ClassVar[int]
    KV_HEADS_FIELD_NUMBER: _ClassVar[int]
    HEAD_DIM_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    BYTES_PER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    layers: int
    kv_heads: int
    head_dim: int
    tokens: int
    rows: int
    bytes: int
    bytes_per_token: int
    def __init__(self, layers: _Optional[int] = ..., kv_heads: _Optional[int] = ..., head_dim: _Optional[int] = ..., tokens: _Optional[int] = ..., rows: _Optional[int] = ..., bytes: _Optional[int] = ..., bytes_per_token: _Optional[int] = ...) -> None: ...

class Layout(_message.Message):
    __slots__ = ("epoch", "kv_dtype", "page_size", "target", "has_draft", "draft", "draft_kv_ratio", "draft_window", "draft_block_size", "max_running_requests", "context_len", "request_cap", "buffers", "target_model", "draft_model", "chunked_prefill_size", "decode_lookahead", "tables_written_event", "tensor_parallel_size")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    KV_DTYPE_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    HAS_DRAFT_FIELD_NUMBER: _ClassVar[int]
    DRAFT_FIELD_NUMBER: _ClassVar[int]
    DRAFT_KV_RATIO_FIELD_NUMBER: _ClassVar[int]
    DRAFT_WINDOW_FIELD_NUMBER: _ClassVar[int]
    DRAFT_BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_RUNNING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_LEN_FIELD_NUMBER: _ClassVar[int]
    REQUEST_CAP_FIELD_NUMBER: _ClassVar[int]
    BUFFERS_FIELD_NUMBER: _ClassVar[int]
    TARGET_MODEL_FIELD_NUMBER: _ClassVar[int]
    DRAFT_MODEL_FIELD_NUMBER: _ClassVar[int]
    CHUNKED_PREFILL_SIZE_FIELD_NUMBER: _ClassVar[int]
    DECODE_LOOKAHEAD_FIELD_NUMBER: _ClassVar[int]
    TABLES_WRITTEN_EVENT_FIELD_NUMBER: _ClassVar[int]
    TENSOR_PARALLEL_SIZE_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    kv_dtype: str
    page_size: int
    target: PoolGeometry
    has_draft: bool
    draft: PoolGeometry
    draft_kv_ratio: float
    draft_window: int
    draft_block_size: int
    max_running_requests: int
    context_len: int
    request_cap: int
    buffers: _containers.RepeatedCompositeFieldContainer[BufferDesc]
    target_model: str
    draft_model: str
    chunked_prefill_size: int
    decode_lookahead: int
    tables_written_event: bytes
    tensor_parallel_size: int
    def __init__(self, epoch: _Optional[int] = ..., kv_dtype: _Optional[str] = ..., page_size: _Optional[int] = ..., target: _Optional[_Union[PoolGeometry, _Mapping]] = ..., has_draft: _Optional[bool] = ..., draft: _Optional[_Union[PoolGeometry, _Mapping]] = ..., draft_kv_ratio: _Optional[float] = ..., draft_window: _Optional[int] = ..., draft_block_size: _Optional[int] = ..., max_running_requests: _Optional[int] = ..., context_len: _Optional[int] = ..., request_cap: _Optional[int] = ..., buffers: _Optional[_Iterable[_Union[BufferDesc, _Mapping]]] = ..., target_model: _Optional[str] = ..., draft_model: _Optional[str] = ..., chunked_prefill_size: _Optional[int] = ..., decode_lookahead: _Optional[int] = ..., tables_written_event: _Optional[bytes] = ..., tensor_parallel_size: _Optional[int] = ...) -> None: ...

class AttachRequest(_message.Message):
    __slots__ = ("client_name", "writes_draft_kv", "model_fingerprint")
    CLIENT_NAME_FIELD_NUMBER: _ClassVar[int]
    WRITES_DRAFT_KV_FIELD_NUMBER: _ClassVar[int]
    MODEL_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    client_name: str
    writes_draft_kv: bool
    model_fingerprint: str
    def __init__(self, client_name: _Optional[str] = ..., writes_draft_kv: _Optional[bool] = ..., model_fingerprint: _Optional[str] = ...) -> None: ...

class Attached(_message.Message):
    __slots__ = ("session_id", "layout", "label")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    layout: Layout
    label: str
    def __init__(self, session_id: _Optional[str] = ..., layout: _Optional[_Union[Layout, _Mapping]] = ..., label: _Optional[str] = ...) -> None: ...

class ShuttingDown(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class SessionEvent(_message.Message):
    __slots__ = ("attached", "shutting_down")
    ATTACHED_FIELD_NUMBER: _ClassVar[int]
    SHUTTING_DOWN_FIELD_NUMBER: _ClassVar[int]
    attached: Attached
    shutting_down: ShuttingDown
    def __init__(self, attached: _Optional[_Union[Attached, _Mapping]] = ..., shutting_down: _Optional[_Union[ShuttingDown, _Mapping]] = ...) -> None: ...

class CommitOp(_message.Message):
    __slots__ = ("rid", "length")
    RID_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    rid: str
    length: int
    def __init__(self, rid: _Optional[str] = ..., length: _Optional[int] = ...) -> None: ...

class TrimOp(_message.Message):
    __slots__ = ("rid", "length")
    RID_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    rid: str
    length: int
    def __init__(self, rid: _Optional[str] = ..., length: _Optional[int] = ...) -> None: ...

class CacheOp(_message.Message):
    __slots__ = ("rid", "token_ids")
    RID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    rid: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, rid: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class FreeRequest(_message.Message):
    __slots__ = ("session_id", "commits", "trims", "finish", "cache")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    COMMITS_FIELD_NUMBER: _ClassVar[int]
    TRIMS_FIELD_NUMBER: _ClassVar[int]
    FINISH_FIELD_NUMBER: _ClassVar[int]
    CACHE_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    commits: _containers.RepeatedCompositeFieldContainer[CommitOp]
    trims: _containers.RepeatedCompositeFieldContainer[TrimOp]
    finish: _containers.RepeatedScalarFieldContainer[str]
    cache: _containers.RepeatedCompositeFieldContainer[CacheOp]
    def __init__(self, session_id: _Optional[str] = ..., commits: _Optional[_Iterable[_Union[CommitOp, _Mapping]]] = ..., trims: _Optional[_Iterable[_Union[TrimOp, _Mapping]]] = ..., finish: _Optional[_Iterable[str]] = ..., cache: _Optional[_Iterable[_Union[CacheOp, _Mapping]]] = ...) -> None: ...

class ExtendOp(_message.Message):
    __slots__ = ("rid", "prefix_len", "num_tokens")
    RID_FIELD_NUMBER: _ClassVar[int]
    PREFIX_LEN_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    rid: str
    prefix_len: int
    num_tokens: int
    def __init__(self, rid: _Optional[str] = ..., prefix_len: _Optional[int] = ..., num_tokens: _Optional[int] = ...) -> None: ...

class GrowOp(_message.Message):
    __slots__ = ("rid", "num_tokens")
    RID_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    rid: str
    num_tokens: int
    def __init__(self, rid: _Optional[str] = ..., num_tokens: _Optional[int] = ...) -> None: ...

class AllocRequest(_message.Message):
    __slots__ = ("session_id", "release", "extends", "grows")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    EXTENDS_FIELD_NUMBER: _ClassVar[int]
    GROWS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    release: FreeRequest
    extends: _containers.RepeatedCompositeFieldContainer[ExtendOp]
    grows: _containers.RepeatedCompositeFieldContainer[GrowOp]
    def __init__(self, session_id: _Optional[str] = ..., release: _Optional[_Union[FreeRequest, _Mapping]] = ..., extends: _Optional[_Iterable[_Union[ExtendOp, _Mapping]]] = ..., grows: _Optional[_Iterable[_Union[GrowOp, _Mapping]]] = ...) -> None: ...

class RequestSlots(_message.Message):
    __slots__ = ("rid", "row", "start", "target_slots", "draft_slots")
    RID_FIELD_NUMBER: _ClassVar[int]
    ROW_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    TARGET_SLOTS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_SLOTS_FIELD_NUMBER: _ClassVar[int]
    rid: str
    row: int
    start: int
    target_slots: _containers.RepeatedScalarFieldContainer[int]
    draft_slots: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, rid: _Optional[str] = ..., row: _Optional[int] = ..., start: _Optional[int] = ..., target_slots: _Optional[_Iterable[int]] = ..., draft_slots: _Optional[_Iterable[int]] = ...) -> None: ...

class AllocResponse(_message.Message):
    __slots__ = ("requests",)
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.RepeatedCompositeFieldContainer[RequestSlots]
    def __init__(self, requests: _Optional[_Iterable[_Union[RequestSlots, _Mapping]]] = ...) -> None: ...

class FreeResponse(_message.Message):
    __slots__ = ("target_freed", "draft_freed")
    TARGET_FREED_FIELD_NUMBER: _ClassVar[int]
    DRAFT_FREED_FIELD_NUMBER: _ClassVar[int]
    target_freed: int
    draft_freed: int
    def __init__(self, target_freed: _Optional[int] = ..., draft_freed: _Optional[int] = ...) -> None: ...

class MatchPrefixRequest(_message.Message):
    __slots__ = ("session_id", "rid", "token_ids", "extend_to")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    RID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    EXTEND_TO_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    rid: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    extend_to: int
    def __init__(self, session_id: _Optional[str] = ..., rid: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., extend_to: _Optional[int] = ...) -> None: ...

class MatchPrefixResponse(_message.Message):
    __slots__ = ("rid", "row", "cached_len", "target_slots", "draft_slots", "extension")
    RID_FIELD_NUMBER: _ClassVar[int]
    ROW_FIELD_NUMBER: _ClassVar[int]
    CACHED_LEN_FIELD_NUMBER: _ClassVar[int]
    TARGET_SLOTS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_SLOTS_FIELD_NUMBER: _ClassVar[int]
    EXTENSION_FIELD_NUMBER: _ClassVar[int]
    rid: str
    row: int
    cached_len: int
    target_slots: _containers.RepeatedScalarFieldContainer[int]
    draft_slots: _containers.RepeatedScalarFieldContainer[int]
    extension: RequestSlots
    def __init__(self, rid: _Optional[str] = ..., row: _Optional[int] = ..., cached_len: _Optional[int] = ..., target_slots: _Optional[_Iterable[int]] = ..., draft_slots: _Optional[_Iterable[int]] = ..., extension: _Optional[_Union[RequestSlots, _Mapping]] = ...) -> None: ...

class MatchItem(_message.Message):
    __slots__ = ("rid", "token_ids", "extend_to")
    RID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    EXTEND_TO_FIELD_NUMBER: _ClassVar[int]
    rid: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    extend_to: int
    def __init__(self, rid: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., extend_to: _Optional[int] = ...) -> None: ...

class MatchPrefixBatchRequest(_message.Message):
    __slots__ = ("session_id", "items")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    items: _containers.RepeatedCompositeFieldContainer[MatchItem]
    def __init__(self, session_id: _Optional[str] = ..., items: _Optional[_Iterable[_Union[MatchItem, _Mapping]]] = ...) -> None: ...

class MatchPrefixBatchResponse(_message.Message):
    __slots__ = ("matches",)
    MATCHES_FIELD_NUMBER: _ClassVar[int]
    matches: _containers.RepeatedCompositeFieldContainer[MatchPrefixResponse]
    def __init__(self, matches: _Optional[_Iterable[_Union[MatchPrefixResponse, _Mapping]]] = ...) -> None: ...

class FlushCacheRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class FlushCacheResponse(_message.Message):
    __slots__ = ("target_freed", "draft_freed")
    TARGET_FREED_FIELD_NUMBER: _ClassVar[int]
    DRAFT_FREED_FIELD_NUMBER: _ClassVar[int]
    target_freed: int
    draft_freed: int
    def __init__(self, target_freed: _Optional[int] = ..., draft_freed: _Optional[int] = ...) -> None: ...

class TranslateRequest(_message.Message):
    __slots__ = ("target_slots",)
    TARGET_SLOTS_FIELD_NUMBER: _ClassVar[int]
    target_slots: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, target_slots: _Optional[_Iterable[int]] = ...) -> None: ...

class TranslateResponse(_message.Message):
    __slots__ = ("draft_slots",)
    DRAFT_SLOTS_FIELD_NUMBER: _ClassVar[int]
    draft_slots: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, draft_slots: _Optional[_Iterable[int]] = ...) -> None: ...

class CapacityRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PoolCapacity(_message.Message):
    __slots__ = ("total", "free", "used", "held_by_requests", "evictable", "protected", "bytes", "bytes_per_rank")
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    FREE_FIELD_NUMBER: _ClassVar[int]
    USED_FIELD_NUMBER: _ClassVar[int]
    HELD_BY_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    EVICTABLE_FIELD_NUMBER: _ClassVar[int]
    PROTECTED_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    BYTES_PER_RANK_FIELD_NUMBER: _ClassVar[int]
    total: int
    free: int
    used: int
    held_by_requests: int
    evictable: int
    protected: int
    bytes: int
    bytes_per_rank: int
    def __init__(self, total: _Optional[int] = ..., free: _Optional[int] = ..., used: _Optional[int] = ..., held_by_requests: _Optional[int] = ..., evictable: _Optional[int] = ..., protected: _Optional[int] = ..., bytes: _Optional[int] = ..., bytes_per_rank: _Optional[int] = ...) -> None: ...

class SessionHolding(_message.Message):
    __slots__ = ("label", "client_name", "model_digest", "target_held", "draft_held")
    LABEL_FIELD_NUMBER: _ClassVar[int]
    CLIENT_NAME_FIELD_NUMBER: _ClassVar[int]
    MODEL_DIGEST_FIELD_NUMBER: _ClassVar[int]
    TARGET_HELD_FIELD_NUMBER: _ClassVar[int]
    DRAFT_HELD_FIELD_NUMBER: _ClassVar[int]
    label: str
    client_name: str
    model_digest: str
    target_held: int
    draft_held: int
    def __init__(self, label: _Optional[str] = ..., client_name: _Optional[str] = ..., model_digest: _Optional[str] = ..., target_held: _Optional[int] = ..., draft_held: _Optional[int] = ...) -> None: ...

class CapacityResponse(_message.Message):
    __slots__ = ("target", "draft", "has_draft", "draft_kv_ratio", "draft_window", "page_size", "request_cap", "max_running_requests", "running_requests", "sessions", "context_len", "epoch", "session_holdings", "tensor_parallel_size")
    TARGET_FIELD_NUMBER: _ClassVar[int]
    DRAFT_FIELD_NUMBER: _ClassVar[int]
    HAS_DRAFT_FIELD_NUMBER: _ClassVar[int]
    DRAFT_KV_RATIO_FIELD_NUMBER: _ClassVar[int]
    DRAFT_WINDOW_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_CAP_FIELD_NUMBER: _ClassVar[int]
    MAX_RUNNING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_LEN_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SESSION_HOLDINGS_FIELD_NUMBER: _ClassVar[int]
    TENSOR_PARALLEL_SIZE_FIELD_NUMBER: _ClassVar[int]
    target: PoolCapacity
    draft: PoolCapacity
    has_draft: bool
    draft_kv_ratio: float
    draft_window: int
    page_size: int
    request_cap: int
    max_running_requests: int
    running_requests: int
    sessions: int
    context_len: int
    epoch: int
    session_holdings: _containers.RepeatedCompositeFieldContainer[SessionHolding]
    tensor_parallel_size: int
    def __init__(self, target: _Optional[_Union[PoolCapacity, _Mapping]] = ..., draft: _Optional[_Union[PoolCapacity, _Mapping]] = ..., has_draft: _Optional[bool] = ..., draft_kv_ratio: _Optional[float] = ..., draft_window: _Optional[int] = ..., page_size: _Optional[int] = ..., request_cap: _Optional[int] = ..., max_running_requests: _Optional[int] = ..., running_requests: _Optional[int] = ..., sessions: _Optional[int] = ..., context_len: _Optional[int] = ..., epoch: _Optional[int] = ..., session_holdings: _Optional[_Iterable[_Union[SessionHolding, _Mapping]]] = ..., tensor_parallel_size: _Optional[int] = ...) -> None: ...

class Call(_message.Message):
    __slots__ = ("seq", "alloc", "free", "match_prefix", "match_prefix_batch")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    ALLOC_FIELD_NUMBER: _ClassVar[int]
    FREE_FIELD_NUMBER: _ClassVar[int]
    MATCH_PREFIX_FIELD_NUMBER: _ClassVar[int]
    MATCH_PREFIX_BATCH_FIELD_NUMBER: _ClassVar[int]
    seq: int
    alloc: AllocRequest
    free: FreeRequest
    match_prefix: MatchPrefixRequest
    match_prefix_batch: MatchPrefixBatchRequest
    def __init__(self, seq: _Optional[int] = ..., alloc: _Optional[_Union[AllocRequest, _Mapping]] = ..., free: _Optional[_Union[FreeRequest, _Mapping]] = ..., match_prefix: _Optional[_Union[MatchPrefixRequest, _Mapping]] = ..., match_prefix_batch: _Optional[_Union[MatchPrefixBatchRequest, _Mapping]] = ...) -> None: ...

class CallError(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class CallAnswer(_message.Message):
    __slots__ = ("seq", "alloc", "free", "match_prefix", "match_prefix_batch", "error")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    ALLOC_FIELD_NUMBER: _ClassVar[int]
    FREE_FIELD_NUMBER: _ClassVar[int]
    MATCH_PREFIX_FIELD_NUMBER: _ClassVar[int]
    MATCH_PREFIX_BATCH_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    seq: int
    alloc: AllocResponse
    free: FreeResponse
    match_prefix: MatchPrefixResponse
    match_prefix_batch: MatchPrefixBatchResponse
    error: CallError
    def __init__(self, seq: _Optional[int] = ..., alloc: _Optional[_Union[AllocResponse, _Mapping]] = ..., free: _Optional[_Union[FreeResponse, _Mapping]] = ..., match_prefix: _Optional[_Union[MatchPrefixResponse, _Mapping]] = ..., match_prefix_batch: _Optional[_Union[MatchPrefixBatchResponse, _Mapping]] = ..., error: _Optional[_Union[CallError, _Mapping]] = ...) -> None: ...
