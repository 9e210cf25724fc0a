import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EntryKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ENTRY_KIND_UNSPECIFIED: _ClassVar[EntryKind]
    ENTRY_KIND_CONFIRM: _ClassVar[EntryKind]
    ENTRY_KIND_ASK: _ClassVar[EntryKind]
    ENTRY_KIND_SECRET: _ClassVar[EntryKind]

class QuestionState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    QUESTION_STATE_UNSPECIFIED: _ClassVar[QuestionState]
    QUESTION_STATE_OPEN: _ClassVar[QuestionState]
    QUESTION_STATE_ANSWERED: _ClassVar[QuestionState]
    QUESTION_STATE_REPLACED: _ClassVar[QuestionState]
    QUESTION_STATE_CANCELLED: _ClassVar[QuestionState]

class ListenEventType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LISTEN_EVENT_TYPE_UNSPECIFIED: _ClassVar[ListenEventType]
    LISTEN_EVENT_TYPE_AVAILABLE: _ClassVar[ListenEventType]
    LISTEN_EVENT_TYPE_SYNCED: _ClassVar[ListenEventType]
    LISTEN_EVENT_TYPE_CLAIMED: _ClassVar[ListenEventType]
    LISTEN_EVENT_TYPE_REMOVED: _ClassVar[ListenEventType]

class RemovalReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REMOVAL_REASON_UNSPECIFIED: _ClassVar[RemovalReason]
    REMOVAL_REASON_ANSWERED: _ClassVar[RemovalReason]
    REMOVAL_REASON_WITHDRAWN: _ClassVar[RemovalReason]
    REMOVAL_REASON_CANCELED: _ClassVar[RemovalReason]
    REMOVAL_REASON_SHUTDOWN: _ClassVar[RemovalReason]
ENTRY_KIND_UNSPECIFIED: EntryKind
ENTRY_KIND_CONFIRM: EntryKind
ENTRY_KIND_ASK: EntryKind
ENTRY_KIND_SECRET: EntryKind
QUESTION_STATE_UNSPECIFIED: QuestionState
QUESTION_STATE_OPEN: QuestionState
QUESTION_STATE_ANSWERED: QuestionState
QUESTION_STATE_REPLACED: QuestionState
QUESTION_STATE_CANCELLED: QuestionState
LISTEN_EVENT_TYPE_UNSPECIFIED: ListenEventType
LISTEN_EVENT_TYPE_AVAILABLE: ListenEventType
LISTEN_EVENT_TYPE_SYNCED: ListenEventType
LISTEN_EVENT_TYPE_CLAIMED: ListenEventType
LISTEN_EVENT_TYPE_REMOVED: ListenEventType
REMOVAL_REASON_UNSPECIFIED: RemovalReason
REMOVAL_REASON_ANSWERED: RemovalReason
REMOVAL_REASON_WITHDRAWN: RemovalReason
REMOVAL_REASON_CANCELED: RemovalReason
REMOVAL_REASON_SHUTDOWN: RemovalReason

class ToolResult(_message.Message):
    __slots__ = ("tool_call_id", "name", "arguments", "output", "arguments_truncated", "output_truncated")
    TOOL_CALL_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    tool_call_id: str
    name: str
    arguments: str
    output: str
    arguments_truncated: bool
    output_truncated: bool
    def __init__(self, tool_call_id: _Optional[str] = ..., name: _Optional[str] = ..., arguments: _Optional[str] = ..., output: _Optional[str] = ..., arguments_truncated: _Optional[bool] = ..., output_truncated: _Optional[bool] = ...) -> None: ...

class PendingEntry(_message.Message):
    __slots__ = ("entry_id", "session_id", "origin", "kind", "payload", "create_time", "claimed_by", "claim_time", "agent_id")
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    CLAIMED_BY_FIELD_NUMBER: _ClassVar[int]
    CLAIM_TIME_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    entry_id: str
    session_id: str
    origin: str
    kind: EntryKind
    payload: str
    create_time: _timestamp_pb2.Timestamp
    claimed_by: str
    claim_time: _timestamp_pb2.Timestamp
    agent_id: str
    def __init__(self, entry_id: _Optional[str] = ..., session_id: _Optional[str] = ..., origin: _Optional[str] = ..., kind: _Optional[_Union[EntryKind, str]] = ..., payload: _Optional[str] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., claimed_by: _Optional[str] = ..., claim_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., agent_id: _Optional[str] = ...) -> None: ...

class PendingSnapshot(_message.Message):
    __slots__ = ("session_id", "entry_id", "payload", "tool_results", "create_time", "origin", "kind", "agent_id")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    TOOL_RESULTS_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    entry_id: str
    payload: str
    tool_results: _containers.RepeatedCompositeFieldContainer[ToolResult]
    create_time: _timestamp_pb2.Timestamp
    origin: str
    kind: EntryKind
    agent_id: str
    def __init__(self, session_id: _Optional[str] = ..., entry_id: _Optional[str] = ..., payload: _Optional[str] = ..., tool_results: _Optional[_Iterable[_Union[ToolResult, _Mapping]]] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., origin: _Optional[str] = ..., kind: _Optional[_Union[EntryKind, str]] = ..., agent_id: _Optional[str] = ...) -> None: ...

class Question(_message.Message):
    __slots__ = ("question_id", "task_id", "text", "revision", "ask_time", "answer", "answered_by", "answer_time", "state", "session_id", "close_time")
    QUESTION_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    ASK_TIME_FIELD_NUMBER: _ClassVar[int]
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    ANSWERED_BY_FIELD_NUMBER: _ClassVar[int]
    ANSWER_TIME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    CLOSE_TIME_FIELD_NUMBER: _ClassVar[int]
    question_id: str
    task_id: str
    text: str
    revision: int
    ask_time: _timestamp_pb2.Timestamp
    answer: str
    answered_by: str
    answer_time: _timestamp_pb2.Timestamp
    state: QuestionState
    session_id: str
    close_time: _timestamp_pb2.Timestamp
    def __init__(self, question_id: _Optional[str] = ..., task_id: _Optional[str] = ..., text: _Optional[str] = ..., revision: _Optional[int] = ..., ask_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., answer: _Optional[str] = ..., answered_by: _Optional[str] = ..., answer_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., state: _Optional[_Union[QuestionState, str]] = ..., session_id: _Optional[str] = ..., close_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class AskRequest(_message.Message):
    __slots__ = ("session_id", "kind", "payload", "tool_results", "agent_id")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    TOOL_RESULTS_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    kind: EntryKind
    payload: str
    tool_results: _containers.RepeatedCompositeFieldContainer[ToolResult]
    agent_id: str
    def __init__(self, session_id: _Optional[str] = ..., kind: _Optional[_Union[EntryKind, str]] = ..., payload: _Optional[str] = ..., tool_results: _Optional[_Iterable[_Union[ToolResult, _Mapping]]] = ..., agent_id: _Optional[str] = ...) -> None: ...

class AskResponse(_message.Message):
    __slots__ = ("entry_id", "answer")
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    entry_id: str
    answer: str
    def __init__(self, entry_id: _Optional[str] = ..., answer: _Optional[str] = ...) -> None: ...

class ListenRequest(_message.Message):
    __slots__ = ("prefix", "listener_name")
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    LISTENER_NAME_FIELD_NUMBER: _ClassVar[int]
    prefix: str
    listener_name: str
    def __init__(self, prefix: _Optional[str] = ..., listener_name: _Optional[str] = ...) -> None: ...

class ListenResponse(_message.Message):
    __slots__ = ("entry", "type", "removal_reason")
    ENTRY_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    REMOVAL_REASON_FIELD_NUMBER: _ClassVar[int]
    entry: PendingEntry
    type: ListenEventType
    removal_reason: RemovalReason
    def __init__(self, entry: _Optional[_Union[PendingEntry, _Mapping]] = ..., type: _Optional[_Union[ListenEventType, str]] = ..., removal_reason: _Optional[_Union[RemovalReason, str]] = ...) -> None: ...

class PickNextRequest(_message.Message):
    __slots__ = ("prefix", "picker", "max_wait")
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    PICKER_FIELD_NUMBER: _ClassVar[int]
    MAX_WAIT_FIELD_NUMBER: _ClassVar[int]
    prefix: str
    picker: str
    max_wait: _duration_pb2.Duration
    def __init__(self, prefix: _Optional[str] = ..., picker: _Optional[str] = ..., max_wait: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class PickNextResponse(_message.Message):
    __slots__ = ("entry",)
    ENTRY_FIELD_NUMBER: _ClassVar[int]
    entry: PendingEntry
    def __init__(self, entry: _Optional[_Union[PendingEntry, _Mapping]] = ...) -> None: ...

class PickNextMatchRequest(_message.Message):
    __slots__ = ("prefix", "picker", "kinds", "session_id", "max_wait")
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    PICKER_FIELD_NUMBER: _ClassVar[int]
    KINDS_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_WAIT_FIELD_NUMBER: _ClassVar[int]
    prefix: str
    picker: str
    kinds: _containers.RepeatedScalarFieldContainer[EntryKind]
    session_id: str
    max_wait: _duration_pb2.Duration
    def __init__(self, prefix: _Optional[str] = ..., picker: _Optional[str] = ..., kinds: _Optional[_Iterable[_Union[EntryKind, str]]] = ..., session_id: _Optional[str] = ..., max_wait: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class PickNextMatchResponse(_message.Message):
    __slots__ = ("entry",)
    ENTRY_FIELD_NUMBER: _ClassVar[int]
    entry: PendingEntry
    def __init__(self, entry: _Optional[_Union[PendingEntry, _Mapping]] = ...) -> None: ...

class ReplyRequest(_message.Message):
    __slots__ = ("entry_id", "answer", "picker")
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    PICKER_FIELD_NUMBER: _ClassVar[int]
    entry_id: str
    answer: str
    picker: str
    def __init__(self, entry_id: _Optional[str] = ..., answer: _Optional[str] = ..., picker: _Optional[str] = ...) -> None: ...

class ReplyResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HasListenerRequest(_message.Message):
    __slots__ = ("origin", "session_id")
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    origin: str
    session_id: str
    def __init__(self, origin: _Optional[str] = ..., session_id: _Optional[str] = ...) -> None: ...

class HasListenerResponse(_message.Message):
    __slots__ = ("has_listener",)
    HAS_LISTENER_FIELD_NUMBER: _ClassVar[int]
    has_listener: bool
    def __init__(self, has_listener: _Optional[bool] = ...) -> None: ...

class CancelSessionRequest(_message.Message):
    __slots__ = ("session_id", "cause", "agent_id")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    CAUSE_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    cause: str
    agent_id: str
    def __init__(self, session_id: _Optional[str] = ..., cause: _Optional[str] = ..., agent_id: _Optional[str] = ...) -> None: ...

class CancelSessionResponse(_message.Message):
    __slots__ = ("deleted", "canceled_entries")
    DELETED_FIELD_NUMBER: _ClassVar[int]
    CANCELED_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    deleted: bool
    canceled_entries: int
    def __init__(self, deleted: _Optional[bool] = ..., canceled_entries: _Optional[int] = ...) -> None: ...

class GetSessionTaskRequest(_message.Message):
    __slots__ = ("session_id", "agent_id")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    agent_id: str
    def __init__(self, session_id: _Optional[str] = ..., agent_id: _Optional[str] = ...) -> None: ...

class GetSessionTaskResponse(_message.Message):
    __slots__ = ("snapshot",)
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    snapshot: PendingSnapshot
    def __init__(self, snapshot: _Optional[_Union[PendingSnapshot, _Mapping]] = ...) -> None: ...

class AskQuestionRequest(_message.Message):
    __slots__ = ("task_id", "session_id", "text", "request_id")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    session_id: str
    text: str
    request_id: str
    def __init__(self, task_id: _Optional[str] = ..., session_id: _Optional[str] = ..., text: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class AskQuestionResponse(_message.Message):
    __slots__ = ("question",)
    QUESTION_FIELD_NUMBER: _ClassVar[int]
    question: Question
    def __init__(self, question: _Optional[_Union[Question, _Mapping]] = ...) -> None: ...

class GetQuestionRequest(_message.Message):
    __slots__ = ("question_id",)
    QUESTION_ID_FIELD_NUMBER: _ClassVar[int]
    question_id: str
    def __init__(self, question_id: _Optional[str] = ...) -> None: ...

class GetQuestionResponse(_message.Message):
    __slots__ = ("question",)
    QUESTION_FIELD_NUMBER: _ClassVar[int]
    question: Question
    def __init__(self, question: _Optional[_Union[Question, _Mapping]] = ...) -> None: ...

class AnswerQuestionRequest(_message.Message):
    __slots__ = ("task_id", "question_id", "answer", "answered_by")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    QUESTION_ID_FIELD_NUMBER: _ClassVar[int]
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    ANSWERED_BY_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    question_id: str
    answer: str
    answered_by: str
    def __init__(self, task_id: _Optional[str] = ..., question_id: _Optional[str] = ..., answer: _Optional[str] = ..., answered_by: _Optional[str] = ...) -> None: ...

class AnswerQuestionResponse(_message.Message):
    __slots__ = ("question", "replayed")
    QUESTION_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    question: Question
    replayed: bool
    def __init__(self, question: _Optional[_Union[Question, _Mapping]] = ..., replayed: _Optional[bool] = ...) -> None: ...

class AwaitAnswerRequest(_message.Message):
    __slots__ = ("question_id",)
    QUESTION_ID_FIELD_NUMBER: _ClassVar[int]
    question_id: str
    def __init__(self, question_id: _Optional[str] = ...) -> None: ...

class AwaitAnswerResponse(_message.Message):
    __slots__ = ("question",)
    QUESTION_FIELD_NUMBER: _ClassVar[int]
    question: Question
    def __init__(self, question: _Optional[_Union[Question, _Mapping]] = ...) -> None: ...

class CancelQuestionsRequest(_message.Message):
    __slots__ = ("task_id",)
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    def __init__(self, task_id: _Optional[str] = ...) -> None: ...

class CancelQuestionsResponse(_message.Message):
    __slots__ = ("questions",)
    QUESTIONS_FIELD_NUMBER: _ClassVar[int]
    questions: _containers.RepeatedCompositeFieldContainer[Question]
    def __init__(self, questions: _Optional[_Iterable[_Union[Question, _Mapping]]] = ...) -> None: ...
