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

class TaskState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TASK_STATE_UNSPECIFIED: _ClassVar[TaskState]
    TASK_STATE_QUEUED: _ClassVar[TaskState]
    TASK_STATE_RUNNING: _ClassVar[TaskState]
    TASK_STATE_WAITING_INPUT: _ClassVar[TaskState]
    TASK_STATE_COMPLETED: _ClassVar[TaskState]
    TASK_STATE_FAILED: _ClassVar[TaskState]
    TASK_STATE_CANCEL_REQUESTED: _ClassVar[TaskState]
    TASK_STATE_CANCELLED: _ClassVar[TaskState]
    TASK_STATE_NEEDS_RECONCILIATION: _ClassVar[TaskState]
    TASK_STATE_RECOVERING: _ClassVar[TaskState]
    TASK_STATE_PAUSED: _ClassVar[TaskState]

class ToolStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TOOL_STATUS_UNSPECIFIED: _ClassVar[ToolStatus]
    TOOL_STATUS_RETURNED: _ClassVar[ToolStatus]
    TOOL_STATUS_ERROR: _ClassVar[ToolStatus]

class ExecutionType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EXECUTION_TYPE_UNSPECIFIED: _ClassVar[ExecutionType]
    EXECUTION_TYPE_WORKER: _ClassVar[ExecutionType]
    EXECUTION_TYPE_GATEWAY_MANAGED: _ClassVar[ExecutionType]

class TaskEventType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TASK_EVENT_TYPE_UNSPECIFIED: _ClassVar[TaskEventType]
    TASK_EVENT_TYPE_SNAPSHOT: _ClassVar[TaskEventType]
    TASK_EVENT_TYPE_STATE_CHANGED: _ClassVar[TaskEventType]
    TASK_EVENT_TYPE_PROGRESS: _ClassVar[TaskEventType]
    TASK_EVENT_TYPE_TOOL: _ClassVar[TaskEventType]
    TASK_EVENT_TYPE_EXECUTION: _ClassVar[TaskEventType]
    TASK_EVENT_TYPE_QUESTION: _ClassVar[TaskEventType]
TASK_STATE_UNSPECIFIED: TaskState
TASK_STATE_QUEUED: TaskState
TASK_STATE_RUNNING: TaskState
TASK_STATE_WAITING_INPUT: TaskState
TASK_STATE_COMPLETED: TaskState
TASK_STATE_FAILED: TaskState
TASK_STATE_CANCEL_REQUESTED: TaskState
TASK_STATE_CANCELLED: TaskState
TASK_STATE_NEEDS_RECONCILIATION: TaskState
TASK_STATE_RECOVERING: TaskState
TASK_STATE_PAUSED: TaskState
TOOL_STATUS_UNSPECIFIED: ToolStatus
TOOL_STATUS_RETURNED: ToolStatus
TOOL_STATUS_ERROR: ToolStatus
EXECUTION_TYPE_UNSPECIFIED: ExecutionType
EXECUTION_TYPE_WORKER: ExecutionType
EXECUTION_TYPE_GATEWAY_MANAGED: ExecutionType
TASK_EVENT_TYPE_UNSPECIFIED: TaskEventType
TASK_EVENT_TYPE_SNAPSHOT: TaskEventType
TASK_EVENT_TYPE_STATE_CHANGED: TaskEventType
TASK_EVENT_TYPE_PROGRESS: TaskEventType
TASK_EVENT_TYPE_TOOL: TaskEventType
TASK_EVENT_TYPE_EXECUTION: TaskEventType
TASK_EVENT_TYPE_QUESTION: TaskEventType

class Progress(_message.Message):
    __slots__ = ("text", "update_time")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_FIELD_NUMBER: _ClassVar[int]
    text: str
    update_time: _timestamp_pb2.Timestamp
    def __init__(self, text: _Optional[str] = ..., update_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ToolEvent(_message.Message):
    __slots__ = ("name", "status", "event_time", "exit_code")
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    EVENT_TIME_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    name: str
    status: ToolStatus
    event_time: _timestamp_pb2.Timestamp
    exit_code: int
    def __init__(self, name: _Optional[str] = ..., status: _Optional[_Union[ToolStatus, str]] = ..., event_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., exit_code: _Optional[int] = ...) -> None: ...

class Activity(_message.Message):
    __slots__ = ("last_activity_time", "last_tool", "recent_tools")
    LAST_ACTIVITY_TIME_FIELD_NUMBER: _ClassVar[int]
    LAST_TOOL_FIELD_NUMBER: _ClassVar[int]
    RECENT_TOOLS_FIELD_NUMBER: _ClassVar[int]
    last_activity_time: _timestamp_pb2.Timestamp
    last_tool: ToolEvent
    recent_tools: _containers.RepeatedCompositeFieldContainer[ToolEvent]
    def __init__(self, last_activity_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_tool: _Optional[_Union[ToolEvent, _Mapping]] = ..., recent_tools: _Optional[_Iterable[_Union[ToolEvent, _Mapping]]] = ...) -> None: ...

class Inspection(_message.Message):
    __slots__ = ("reason", "since_time")
    REASON_FIELD_NUMBER: _ClassVar[int]
    SINCE_TIME_FIELD_NUMBER: _ClassVar[int]
    reason: str
    since_time: _timestamp_pb2.Timestamp
    def __init__(self, reason: _Optional[str] = ..., since_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Timing(_message.Message):
    __slots__ = ("create_time", "first_start_time", "start_time", "end_time", "elapsed_ms")
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    FIRST_START_TIME_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_MS_FIELD_NUMBER: _ClassVar[int]
    create_time: _timestamp_pb2.Timestamp
    first_start_time: _timestamp_pb2.Timestamp
    start_time: _timestamp_pb2.Timestamp
    end_time: _timestamp_pb2.Timestamp
    elapsed_ms: int
    def __init__(self, create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., first_start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., end_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., elapsed_ms: _Optional[int] = ...) -> None: ...

class Cancellation(_message.Message):
    __slots__ = ("request_time", "cause", "replaced_by_task_id", "cleanup")
    REQUEST_TIME_FIELD_NUMBER: _ClassVar[int]
    CAUSE_FIELD_NUMBER: _ClassVar[int]
    REPLACED_BY_TASK_ID_FIELD_NUMBER: _ClassVar[int]
    CLEANUP_FIELD_NUMBER: _ClassVar[int]
    request_time: _timestamp_pb2.Timestamp
    cause: str
    replaced_by_task_id: str
    cleanup: str
    def __init__(self, request_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., cause: _Optional[str] = ..., replaced_by_task_id: _Optional[str] = ..., cleanup: _Optional[str] = ...) -> None: ...

class Failure(_message.Message):
    __slots__ = ("code", "message", "retryable", "exit_code")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RETRYABLE_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str
    retryable: bool
    exit_code: int
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ..., retryable: _Optional[bool] = ..., exit_code: _Optional[int] = ...) -> None: ...

class Result(_message.Message):
    __slots__ = ("text", "unresolved_background")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    UNRESOLVED_BACKGROUND_FIELD_NUMBER: _ClassVar[int]
    text: str
    unresolved_background: bool
    def __init__(self, text: _Optional[str] = ..., unresolved_background: _Optional[bool] = ...) -> None: ...

class PendingQuestion(_message.Message):
    __slots__ = ("question_id", "text", "revision")
    QUESTION_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    question_id: str
    text: str
    revision: int
    def __init__(self, question_id: _Optional[str] = ..., text: _Optional[str] = ..., revision: _Optional[int] = ...) -> None: ...

class RestartResume(_message.Message):
    __slots__ = ("count", "revision", "pending", "last_progress")
    COUNT_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    LAST_PROGRESS_FIELD_NUMBER: _ClassVar[int]
    count: int
    revision: int
    pending: bool
    last_progress: str
    def __init__(self, count: _Optional[int] = ..., revision: _Optional[int] = ..., pending: _Optional[bool] = ..., last_progress: _Optional[str] = ...) -> None: ...

class Workspace(_message.Message):
    __slots__ = ("mode", "path")
    MODE_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    mode: str
    path: str
    def __init__(self, mode: _Optional[str] = ..., path: _Optional[str] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("input_tokens", "cached_input_tokens", "output_tokens")
    INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    input_tokens: int
    cached_input_tokens: int
    output_tokens: int
    def __init__(self, input_tokens: _Optional[int] = ..., cached_input_tokens: _Optional[int] = ..., output_tokens: _Optional[int] = ...) -> None: ...

class ProcessIdentity(_message.Message):
    __slots__ = ("pid", "start_time")
    PID_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    pid: int
    start_time: int
    def __init__(self, pid: _Optional[int] = ..., start_time: _Optional[int] = ...) -> None: ...

class Attempt(_message.Message):
    __slots__ = ("attempt_id", "number", "start_time", "end_time", "pid", "pgid", "pid_start_time", "boot_id", "harness", "harness_model", "usage", "exit_code", "outcome", "descendants")
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    NUMBER_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    PGID_FIELD_NUMBER: _ClassVar[int]
    PID_START_TIME_FIELD_NUMBER: _ClassVar[int]
    BOOT_ID_FIELD_NUMBER: _ClassVar[int]
    HARNESS_FIELD_NUMBER: _ClassVar[int]
    HARNESS_MODEL_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    DESCENDANTS_FIELD_NUMBER: _ClassVar[int]
    attempt_id: str
    number: int
    start_time: _timestamp_pb2.Timestamp
    end_time: _timestamp_pb2.Timestamp
    pid: int
    pgid: int
    pid_start_time: int
    boot_id: str
    harness: str
    harness_model: str
    usage: Usage
    exit_code: int
    outcome: str
    descendants: _containers.RepeatedCompositeFieldContainer[ProcessIdentity]
    def __init__(self, attempt_id: _Optional[str] = ..., number: _Optional[int] = ..., start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., end_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., pid: _Optional[int] = ..., pgid: _Optional[int] = ..., pid_start_time: _Optional[int] = ..., boot_id: _Optional[str] = ..., harness: _Optional[str] = ..., harness_model: _Optional[str] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., exit_code: _Optional[int] = ..., outcome: _Optional[str] = ..., descendants: _Optional[_Iterable[_Union[ProcessIdentity, _Mapping]]] = ...) -> None: ...

class SkillRef(_message.Message):
    __slots__ = ("name", "args_json", "invocation")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGS_JSON_FIELD_NUMBER: _ClassVar[int]
    INVOCATION_FIELD_NUMBER: _ClassVar[int]
    name: str
    args_json: str
    invocation: str
    def __init__(self, name: _Optional[str] = ..., args_json: _Optional[str] = ..., invocation: _Optional[str] = ...) -> None: ...

class Subagent(_message.Message):
    __slots__ = ("task_id", "title", "state", "harness", "harness_model")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    HARNESS_FIELD_NUMBER: _ClassVar[int]
    HARNESS_MODEL_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    title: str
    state: TaskState
    harness: str
    harness_model: str
    def __init__(self, task_id: _Optional[str] = ..., title: _Optional[str] = ..., state: _Optional[_Union[TaskState, str]] = ..., harness: _Optional[str] = ..., harness_model: _Optional[str] = ...) -> None: ...

class ToolCount(_message.Message):
    __slots__ = ("name", "count")
    NAME_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    name: str
    count: int
    def __init__(self, name: _Optional[str] = ..., count: _Optional[int] = ...) -> None: ...

class Evidence(_message.Message):
    __slots__ = ("skills", "subagents", "subagent_models", "tool_counts", "observed_paths", "current_filesystem_verified")
    SKILLS_FIELD_NUMBER: _ClassVar[int]
    SUBAGENTS_FIELD_NUMBER: _ClassVar[int]
    SUBAGENT_MODELS_FIELD_NUMBER: _ClassVar[int]
    TOOL_COUNTS_FIELD_NUMBER: _ClassVar[int]
    OBSERVED_PATHS_FIELD_NUMBER: _ClassVar[int]
    CURRENT_FILESYSTEM_VERIFIED_FIELD_NUMBER: _ClassVar[int]
    skills: _containers.RepeatedScalarFieldContainer[str]
    subagents: _containers.RepeatedScalarFieldContainer[str]
    subagent_models: _containers.RepeatedScalarFieldContainer[str]
    tool_counts: _containers.RepeatedCompositeFieldContainer[ToolCount]
    observed_paths: _containers.RepeatedScalarFieldContainer[str]
    current_filesystem_verified: bool
    def __init__(self, skills: _Optional[_Iterable[str]] = ..., subagents: _Optional[_Iterable[str]] = ..., subagent_models: _Optional[_Iterable[str]] = ..., tool_counts: _Optional[_Iterable[_Union[ToolCount, _Mapping]]] = ..., observed_paths: _Optional[_Iterable[str]] = ..., current_filesystem_verified: _Optional[bool] = ...) -> None: ...

class Execution(_message.Message):
    __slots__ = ("available", "reason", "observe_time", "last_activity_time", "historical", "cpu_user_ticks", "cpu_system_ticks", "io_read_count", "io_write_count", "io_read_bytes", "io_write_bytes", "processes")
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    OBSERVE_TIME_FIELD_NUMBER: _ClassVar[int]
    LAST_ACTIVITY_TIME_FIELD_NUMBER: _ClassVar[int]
    HISTORICAL_FIELD_NUMBER: _ClassVar[int]
    CPU_USER_TICKS_FIELD_NUMBER: _ClassVar[int]
    CPU_SYSTEM_TICKS_FIELD_NUMBER: _ClassVar[int]
    IO_READ_COUNT_FIELD_NUMBER: _ClassVar[int]
    IO_WRITE_COUNT_FIELD_NUMBER: _ClassVar[int]
    IO_READ_BYTES_FIELD_NUMBER: _ClassVar[int]
    IO_WRITE_BYTES_FIELD_NUMBER: _ClassVar[int]
    PROCESSES_FIELD_NUMBER: _ClassVar[int]
    available: bool
    reason: str
    observe_time: _timestamp_pb2.Timestamp
    last_activity_time: _timestamp_pb2.Timestamp
    historical: bool
    cpu_user_ticks: int
    cpu_system_ticks: int
    io_read_count: int
    io_write_count: int
    io_read_bytes: int
    io_write_bytes: int
    processes: _containers.RepeatedCompositeFieldContainer[ProcessIdentity]
    def __init__(self, available: _Optional[bool] = ..., reason: _Optional[str] = ..., observe_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_activity_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., historical: _Optional[bool] = ..., cpu_user_ticks: _Optional[int] = ..., cpu_system_ticks: _Optional[int] = ..., io_read_count: _Optional[int] = ..., io_write_count: _Optional[int] = ..., io_read_bytes: _Optional[int] = ..., io_write_bytes: _Optional[int] = ..., processes: _Optional[_Iterable[_Union[ProcessIdentity, _Mapping]]] = ...) -> None: ...

class Task(_message.Message):
    __slots__ = ("task_id", "agent_id", "session_id", "title", "instructions", "state", "execution_type", "target_profile", "progress", "activity", "execution", "inspection", "timing", "cancellation", "failure", "result", "pending_question", "harness", "harness_model", "workspace", "observed_paths", "current_filesystem_verified", "attempts", "update_time", "restart_resume", "version", "continue_task_id", "continued_by_task_id", "parent_task_id", "skill", "subagents", "evidence", "gateway_target", "gateway_dispatch")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    INSTRUCTIONS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_TYPE_FIELD_NUMBER: _ClassVar[int]
    TARGET_PROFILE_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    ACTIVITY_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_FIELD_NUMBER: _ClassVar[int]
    INSPECTION_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    CANCELLATION_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    PENDING_QUESTION_FIELD_NUMBER: _ClassVar[int]
    HARNESS_FIELD_NUMBER: _ClassVar[int]
    HARNESS_MODEL_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_FIELD_NUMBER: _ClassVar[int]
    OBSERVED_PATHS_FIELD_NUMBER: _ClassVar[int]
    CURRENT_FILESYSTEM_VERIFIED_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_FIELD_NUMBER: _ClassVar[int]
    RESTART_RESUME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CONTINUE_TASK_ID_FIELD_NUMBER: _ClassVar[int]
    CONTINUED_BY_TASK_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_TASK_ID_FIELD_NUMBER: _ClassVar[int]
    SKILL_FIELD_NUMBER: _ClassVar[int]
    SUBAGENTS_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    GATEWAY_TARGET_FIELD_NUMBER: _ClassVar[int]
    GATEWAY_DISPATCH_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    agent_id: str
    session_id: str
    title: str
    instructions: str
    state: TaskState
    execution_type: ExecutionType
    target_profile: str
    progress: Progress
    activity: Activity
    execution: Execution
    inspection: Inspection
    timing: Timing
    cancellation: Cancellation
    failure: Failure
    result: Result
    pending_question: PendingQuestion
    harness: str
    harness_model: str
    workspace: Workspace
    observed_paths: _containers.RepeatedScalarFieldContainer[str]
    current_filesystem_verified: bool
    attempts: _containers.RepeatedCompositeFieldContainer[Attempt]
    update_time: _timestamp_pb2.Timestamp
    restart_resume: RestartResume
    version: int
    continue_task_id: str
    continued_by_task_id: str
    parent_task_id: str
    skill: SkillRef
    subagents: _containers.RepeatedCompositeFieldContainer[Subagent]
    evidence: Evidence
    gateway_target: GatewayTarget
    gateway_dispatch: GatewayDispatch
    def __init__(self, task_id: _Optional[str] = ..., agent_id: _Optional[str] = ..., session_id: _Optional[str] = ..., title: _Optional[str] = ..., instructions: _Optional[str] = ..., state: _Optional[_Union[TaskState, str]] = ..., execution_type: _Optional[_Union[ExecutionType, str]] = ..., target_profile: _Optional[str] = ..., progress: _Optional[_Union[Progress, _Mapping]] = ..., activity: _Optional[_Union[Activity, _Mapping]] = ..., execution: _Optional[_Union[Execution, _Mapping]] = ..., inspection: _Optional[_Union[Inspection, _Mapping]] = ..., timing: _Optional[_Union[Timing, _Mapping]] = ..., cancellation: _Optional[_Union[Cancellation, _Mapping]] = ..., failure: _Optional[_Union[Failure, _Mapping]] = ..., result: _Optional[_Union[Result, _Mapping]] = ..., pending_question: _Optional[_Union[PendingQuestion, _Mapping]] = ..., harness: _Optional[str] = ..., harness_model: _Optional[str] = ..., workspace: _Optional[_Union[Workspace, _Mapping]] = ..., observed_paths: _Optional[_Iterable[str]] = ..., current_filesystem_verified: _Optional[bool] = ..., attempts: _Optional[_Iterable[_Union[Attempt, _Mapping]]] = ..., update_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., restart_resume: _Optional[_Union[RestartResume, _Mapping]] = ..., version: _Optional[int] = ..., continue_task_id: _Optional[str] = ..., continued_by_task_id: _Optional[str] = ..., parent_task_id: _Optional[str] = ..., skill: _Optional[_Union[SkillRef, _Mapping]] = ..., subagents: _Optional[_Iterable[_Union[Subagent, _Mapping]]] = ..., evidence: _Optional[_Union[Evidence, _Mapping]] = ..., gateway_target: _Optional[_Union[GatewayTarget, _Mapping]] = ..., gateway_dispatch: _Optional[_Union[GatewayDispatch, _Mapping]] = ...) -> None: ...

class GatewayTarget(_message.Message):
    __slots__ = ("adapter", "native_session_id", "display_name", "options", "name")
    class OptionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    NATIVE_SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    DISPLAY_NAME_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    adapter: str
    native_session_id: str
    display_name: str
    options: _containers.ScalarMap[str, str]
    name: str
    def __init__(self, adapter: _Optional[str] = ..., native_session_id: _Optional[str] = ..., display_name: _Optional[str] = ..., options: _Optional[_Mapping[str, str]] = ..., name: _Optional[str] = ...) -> None: ...

class GatewayDispatch(_message.Message):
    __slots__ = ("request_id", "submit_time")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SUBMIT_TIME_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    submit_time: _timestamp_pb2.Timestamp
    def __init__(self, request_id: _Optional[str] = ..., submit_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class CreateTaskRequest(_message.Message):
    __slots__ = ("agent_id", "session_id", "title", "instructions", "profile", "request_id", "harness", "harness_model", "continue_task_id", "skill", "target", "safemode_cleared")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    INSTRUCTIONS_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    HARNESS_FIELD_NUMBER: _ClassVar[int]
    HARNESS_MODEL_FIELD_NUMBER: _ClassVar[int]
    CONTINUE_TASK_ID_FIELD_NUMBER: _ClassVar[int]
    SKILL_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    SAFEMODE_CLEARED_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    session_id: str
    title: str
    instructions: str
    profile: str
    request_id: str
    harness: str
    harness_model: str
    continue_task_id: str
    skill: SkillInvocation
    target: TargetRequest
    safemode_cleared: bool
    def __init__(self, agent_id: _Optional[str] = ..., session_id: _Optional[str] = ..., title: _Optional[str] = ..., instructions: _Optional[str] = ..., profile: _Optional[str] = ..., request_id: _Optional[str] = ..., harness: _Optional[str] = ..., harness_model: _Optional[str] = ..., continue_task_id: _Optional[str] = ..., skill: _Optional[_Union[SkillInvocation, _Mapping]] = ..., target: _Optional[_Union[TargetRequest, _Mapping]] = ..., safemode_cleared: _Optional[bool] = ...) -> None: ...

class TargetRequest(_message.Message):
    __slots__ = ("name", "native_session_id", "display_name", "options")
    class OptionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    NATIVE_SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    DISPLAY_NAME_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    name: str
    native_session_id: str
    display_name: str
    options: _containers.ScalarMap[str, str]
    def __init__(self, name: _Optional[str] = ..., native_session_id: _Optional[str] = ..., display_name: _Optional[str] = ..., options: _Optional[_Mapping[str, str]] = ...) -> None: ...

class SkillInvocation(_message.Message):
    __slots__ = ("name", "args_json")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGS_JSON_FIELD_NUMBER: _ClassVar[int]
    name: str
    args_json: str
    def __init__(self, name: _Optional[str] = ..., args_json: _Optional[str] = ...) -> None: ...

class CreateTaskResponse(_message.Message):
    __slots__ = ("task",)
    TASK_FIELD_NUMBER: _ClassVar[int]
    task: Task
    def __init__(self, task: _Optional[_Union[Task, _Mapping]] = ...) -> None: ...

class CreateTasksRequest(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[CreateTasksItem]
    def __init__(self, items: _Optional[_Iterable[_Union[CreateTasksItem, _Mapping]]] = ...) -> None: ...

class CreateTasksItem(_message.Message):
    __slots__ = ("request", "call_id")
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    request: CreateTaskRequest
    call_id: str
    def __init__(self, request: _Optional[_Union[CreateTaskRequest, _Mapping]] = ..., call_id: _Optional[str] = ...) -> None: ...

class CreateTasksResponse(_message.Message):
    __slots__ = ("outcomes",)
    OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    outcomes: _containers.RepeatedCompositeFieldContainer[CreateTaskOutcome]
    def __init__(self, outcomes: _Optional[_Iterable[_Union[CreateTaskOutcome, _Mapping]]] = ...) -> None: ...

class StreamCreateTasksRequest(_message.Message):
    __slots__ = ("batch_id", "items")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    batch_id: int
    items: _containers.RepeatedCompositeFieldContainer[CreateTasksItem]
    def __init__(self, batch_id: _Optional[int] = ..., items: _Optional[_Iterable[_Union[CreateTasksItem, _Mapping]]] = ...) -> None: ...

class StreamCreateTasksResponse(_message.Message):
    __slots__ = ("batch_id", "outcomes", "error_status")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    ERROR_STATUS_FIELD_NUMBER: _ClassVar[int]
    batch_id: int
    outcomes: _containers.RepeatedCompositeFieldContainer[CreateTaskOutcome]
    error_status: bytes
    def __init__(self, batch_id: _Optional[int] = ..., outcomes: _Optional[_Iterable[_Union[CreateTaskOutcome, _Mapping]]] = ..., error_status: _Optional[bytes] = ...) -> None: ...

class CreateTaskOutcome(_message.Message):
    __slots__ = ("task", "error_status")
    TASK_FIELD_NUMBER: _ClassVar[int]
    ERROR_STATUS_FIELD_NUMBER: _ClassVar[int]
    task: Task
    error_status: bytes
    def __init__(self, task: _Optional[_Union[Task, _Mapping]] = ..., error_status: _Optional[bytes] = ...) -> None: ...

class GetTaskRequest(_message.Message):
    __slots__ = ("task_id",)
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    def __init__(self, task_id: _Optional[str] = ...) -> None: ...

class GetTaskResponse(_message.Message):
    __slots__ = ("task",)
    TASK_FIELD_NUMBER: _ClassVar[int]
    task: Task
    def __init__(self, task: _Optional[_Union[Task, _Mapping]] = ...) -> None: ...

class ListTasksRequest(_message.Message):
    __slots__ = ("agent_id", "session_id", "page", "page_size", "include_finished", "preview_chars")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_FINISHED_FIELD_NUMBER: _ClassVar[int]
    PREVIEW_CHARS_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    session_id: str
    page: int
    page_size: int
    include_finished: bool
    preview_chars: int
    def __init__(self, agent_id: _Optional[str] = ..., session_id: _Optional[str] = ..., page: _Optional[int] = ..., page_size: _Optional[int] = ..., include_finished: _Optional[bool] = ..., preview_chars: _Optional[int] = ...) -> None: ...

class ListTasksResponse(_message.Message):
    __slots__ = ("page", "pages", "total", "tasks")
    PAGE_FIELD_NUMBER: _ClassVar[int]
    PAGES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    page: int
    pages: int
    total: int
    tasks: _containers.RepeatedCompositeFieldContainer[Task]
    def __init__(self, page: _Optional[int] = ..., pages: _Optional[int] = ..., total: _Optional[int] = ..., tasks: _Optional[_Iterable[_Union[Task, _Mapping]]] = ...) -> None: ...

class CancelTaskRequest(_message.Message):
    __slots__ = ("task_id", "cause", "replaced_by_task_id")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    CAUSE_FIELD_NUMBER: _ClassVar[int]
    REPLACED_BY_TASK_ID_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    cause: str
    replaced_by_task_id: str
    def __init__(self, task_id: _Optional[str] = ..., cause: _Optional[str] = ..., replaced_by_task_id: _Optional[str] = ...) -> None: ...

class CancelTaskResponse(_message.Message):
    __slots__ = ("task",)
    TASK_FIELD_NUMBER: _ClassVar[int]
    task: Task
    def __init__(self, task: _Optional[_Union[Task, _Mapping]] = ...) -> None: ...

class RetryCleanupRequest(_message.Message):
    __slots__ = ("task_id",)
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    def __init__(self, task_id: _Optional[str] = ...) -> None: ...

class RetryCleanupResponse(_message.Message):
    __slots__ = ("task",)
    TASK_FIELD_NUMBER: _ClassVar[int]
    task: Task
    def __init__(self, task: _Optional[_Union[Task, _Mapping]] = ...) -> None: ...

class WatchTasksRequest(_message.Message):
    __slots__ = ("agent_id", "session_id", "task_id", "all_sessions", "since_sequence", "event_types", "batch")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    ALL_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    SINCE_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    EVENT_TYPES_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    session_id: str
    task_id: str
    all_sessions: bool
    since_sequence: int
    event_types: _containers.RepeatedScalarFieldContainer[TaskEventType]
    batch: bool
    def __init__(self, agent_id: _Optional[str] = ..., session_id: _Optional[str] = ..., task_id: _Optional[str] = ..., all_sessions: _Optional[bool] = ..., since_sequence: _Optional[int] = ..., event_types: _Optional[_Iterable[_Union[TaskEventType, str]]] = ..., batch: _Optional[bool] = ...) -> None: ...

class WatchTasksResponse(_message.Message):
    __slots__ = ("sequence", "type", "event_time", "task", "events")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    EVENT_TIME_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    type: TaskEventType
    event_time: _timestamp_pb2.Timestamp
    task: Task
    events: _containers.RepeatedCompositeFieldContainer[TaskEvent]
    def __init__(self, sequence: _Optional[int] = ..., type: _Optional[_Union[TaskEventType, str]] = ..., event_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., task: _Optional[_Union[Task, _Mapping]] = ..., events: _Optional[_Iterable[_Union[TaskEvent, _Mapping]]] = ...) -> None: ...

class TaskEvent(_message.Message):
    __slots__ = ("sequence", "type", "event_time", "task")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    EVENT_TIME_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    type: TaskEventType
    event_time: _timestamp_pb2.Timestamp
    task: Task
    def __init__(self, sequence: _Optional[int] = ..., type: _Optional[_Union[TaskEventType, str]] = ..., event_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., task: _Optional[_Union[Task, _Mapping]] = ...) -> None: ...

class GetAssignmentRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetAssignmentResponse(_message.Message):
    __slots__ = ("task_id", "attempt_id", "title", "instructions", "resume", "last_progress", "skill_name", "skill_args_json")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    INSTRUCTIONS_FIELD_NUMBER: _ClassVar[int]
    RESUME_FIELD_NUMBER: _ClassVar[int]
    LAST_PROGRESS_FIELD_NUMBER: _ClassVar[int]
    SKILL_NAME_FIELD_NUMBER: _ClassVar[int]
    SKILL_ARGS_JSON_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    attempt_id: str
    title: str
    instructions: str
    resume: bool
    last_progress: str
    skill_name: str
    skill_args_json: str
    def __init__(self, task_id: _Optional[str] = ..., attempt_id: _Optional[str] = ..., title: _Optional[str] = ..., instructions: _Optional[str] = ..., resume: _Optional[bool] = ..., last_progress: _Optional[str] = ..., skill_name: _Optional[str] = ..., skill_args_json: _Optional[str] = ...) -> None: ...

class ReportProgressRequest(_message.Message):
    __slots__ = ("text",)
    TEXT_FIELD_NUMBER: _ClassVar[int]
    text: str
    def __init__(self, text: _Optional[str] = ...) -> None: ...

class ReportProgressResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReportToolRequest(_message.Message):
    __slots__ = ("name", "status", "exit_code")
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    name: str
    status: ToolStatus
    exit_code: int
    def __init__(self, name: _Optional[str] = ..., status: _Optional[_Union[ToolStatus, str]] = ..., exit_code: _Optional[int] = ...) -> None: ...

class ReportToolResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReportTouchedRequest(_message.Message):
    __slots__ = ("paths",)
    PATHS_FIELD_NUMBER: _ClassVar[int]
    paths: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, paths: _Optional[_Iterable[str]] = ...) -> None: ...

class ReportTouchedResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReportUsageRequest(_message.Message):
    __slots__ = ("input_tokens", "cached_input_tokens", "output_tokens", "delta")
    INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    input_tokens: int
    cached_input_tokens: int
    output_tokens: int
    delta: bool
    def __init__(self, input_tokens: _Optional[int] = ..., cached_input_tokens: _Optional[int] = ..., output_tokens: _Optional[int] = ..., delta: _Optional[bool] = ...) -> None: ...

class ReportUsageResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReportResultRequest(_message.Message):
    __slots__ = ("text", "unresolved_background")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    UNRESOLVED_BACKGROUND_FIELD_NUMBER: _ClassVar[int]
    text: str
    unresolved_background: bool
    def __init__(self, text: _Optional[str] = ..., unresolved_background: _Optional[bool] = ...) -> None: ...

class ReportResultResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AskQuestionRequest(_message.Message):
    __slots__ = ("text",)
    TEXT_FIELD_NUMBER: _ClassVar[int]
    text: str
    def __init__(self, text: _Optional[str] = ...) -> None: ...

class AskQuestionResponse(_message.Message):
    __slots__ = ("question_id", "revision")
    QUESTION_ID_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    question_id: str
    revision: int
    def __init__(self, question_id: _Optional[str] = ..., revision: _Optional[int] = ...) -> None: ...

class AwaitAnswerRequest(_message.Message):
    __slots__ = ("question_id", "max_wait")
    QUESTION_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_WAIT_FIELD_NUMBER: _ClassVar[int]
    question_id: str
    max_wait: _duration_pb2.Duration
    def __init__(self, question_id: _Optional[str] = ..., max_wait: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class AwaitAnswerResponse(_message.Message):
    __slots__ = ("answered", "answer")
    ANSWERED_FIELD_NUMBER: _ClassVar[int]
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    answered: bool
    answer: str
    def __init__(self, answered: _Optional[bool] = ..., answer: _Optional[str] = ...) -> None: ...

class PauseTaskRequest(_message.Message):
    __slots__ = ("task_id", "wait_ms")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    wait_ms: int
    def __init__(self, task_id: _Optional[str] = ..., wait_ms: _Optional[int] = ...) -> None: ...

class PauseTaskResponse(_message.Message):
    __slots__ = ("task",)
    TASK_FIELD_NUMBER: _ClassVar[int]
    task: Task
    def __init__(self, task: _Optional[_Union[Task, _Mapping]] = ...) -> None: ...

class ResumeTaskRequest(_message.Message):
    __slots__ = ("task_id",)
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    def __init__(self, task_id: _Optional[str] = ...) -> None: ...

class ResumeTaskResponse(_message.Message):
    __slots__ = ("task",)
    TASK_FIELD_NUMBER: _ClassVar[int]
    task: Task
    def __init__(self, task: _Optional[_Union[Task, _Mapping]] = ...) -> None: ...

class GetWorkerLogRequest(_message.Message):
    __slots__ = ("task_id", "attempt_number", "tail_bytes")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_NUMBER_FIELD_NUMBER: _ClassVar[int]
    TAIL_BYTES_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    attempt_number: int
    tail_bytes: int
    def __init__(self, task_id: _Optional[str] = ..., attempt_number: _Optional[int] = ..., tail_bytes: _Optional[int] = ...) -> None: ...

class GetWorkerLogResponse(_message.Message):
    __slots__ = ("attempt_number", "content", "size_bytes", "truncated", "expired")
    ATTEMPT_NUMBER_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    EXPIRED_FIELD_NUMBER: _ClassVar[int]
    attempt_number: int
    content: bytes
    size_bytes: int
    truncated: bool
    expired: bool
    def __init__(self, attempt_number: _Optional[int] = ..., content: _Optional[bytes] = ..., size_bytes: _Optional[int] = ..., truncated: _Optional[bool] = ..., expired: _Optional[bool] = ...) -> None: ...

class SpawnTaskRequest(_message.Message):
    __slots__ = ("title", "instructions", "profile", "request_id")
    TITLE_FIELD_NUMBER: _ClassVar[int]
    INSTRUCTIONS_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    title: str
    instructions: str
    profile: str
    request_id: str
    def __init__(self, title: _Optional[str] = ..., instructions: _Optional[str] = ..., profile: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class SpawnTaskResponse(_message.Message):
    __slots__ = ("task_id", "state")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    state: TaskState
    def __init__(self, task_id: _Optional[str] = ..., state: _Optional[_Union[TaskState, str]] = ...) -> None: ...

class WaitSubtaskRequest(_message.Message):
    __slots__ = ("task_id", "max_wait")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_WAIT_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    max_wait: _duration_pb2.Duration
    def __init__(self, task_id: _Optional[str] = ..., max_wait: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class WaitSubtaskResponse(_message.Message):
    __slots__ = ("task_id", "state", "finished", "result_text", "failure_code")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    RESULT_TEXT_FIELD_NUMBER: _ClassVar[int]
    FAILURE_CODE_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    state: TaskState
    finished: bool
    result_text: str
    failure_code: str
    def __init__(self, task_id: _Optional[str] = ..., state: _Optional[_Union[TaskState, str]] = ..., finished: _Optional[bool] = ..., result_text: _Optional[str] = ..., failure_code: _Optional[str] = ...) -> None: ...

class CancelSubtaskRequest(_message.Message):
    __slots__ = ("task_id",)
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    def __init__(self, task_id: _Optional[str] = ...) -> None: ...

class CancelSubtaskResponse(_message.Message):
    __slots__ = ("task_id", "state")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    state: TaskState
    def __init__(self, task_id: _Optional[str] = ..., state: _Optional[_Union[TaskState, str]] = ...) -> None: ...

class RecordDispatchOutcomeRequest(_message.Message):
    __slots__ = ("request_id", "body", "signature")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    body: bytes
    signature: str
    def __init__(self, request_id: _Optional[str] = ..., body: _Optional[bytes] = ..., signature: _Optional[str] = ...) -> None: ...

class RecordDispatchOutcomeResponse(_message.Message):
    __slots__ = ("task_id", "state")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    state: TaskState
    def __init__(self, task_id: _Optional[str] = ..., state: _Optional[_Union[TaskState, str]] = ...) -> None: ...

class SchedulerHost(_message.Message):
    __slots__ = ("host_id", "boot_id", "start_time", "lease_expire_time", "lease_live", "connected", "serving", "queued_tasks", "active_tasks", "needs_reconciliation_tasks", "host_lost_tasks", "resolvable_tasks")
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    BOOT_ID_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    LEASE_LIVE_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    SERVING_FIELD_NUMBER: _ClassVar[int]
    QUEUED_TASKS_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_TASKS_FIELD_NUMBER: _ClassVar[int]
    NEEDS_RECONCILIATION_TASKS_FIELD_NUMBER: _ClassVar[int]
    HOST_LOST_TASKS_FIELD_NUMBER: _ClassVar[int]
    RESOLVABLE_TASKS_FIELD_NUMBER: _ClassVar[int]
    host_id: str
    boot_id: str
    start_time: _timestamp_pb2.Timestamp
    lease_expire_time: _timestamp_pb2.Timestamp
    lease_live: bool
    connected: bool
    serving: bool
    queued_tasks: int
    active_tasks: int
    needs_reconciliation_tasks: int
    host_lost_tasks: int
    resolvable_tasks: int
    def __init__(self, host_id: _Optional[str] = ..., boot_id: _Optional[str] = ..., start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., lease_expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., lease_live: _Optional[bool] = ..., connected: _Optional[bool] = ..., serving: _Optional[bool] = ..., queued_tasks: _Optional[int] = ..., active_tasks: _Optional[int] = ..., needs_reconciliation_tasks: _Optional[int] = ..., host_lost_tasks: _Optional[int] = ..., resolvable_tasks: _Optional[int] = ...) -> None: ...

class ListHostsRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListHostsResponse(_message.Message):
    __slots__ = ("hosts", "next_page_token")
    HOSTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    hosts: _containers.RepeatedCompositeFieldContainer[SchedulerHost]
    next_page_token: str
    def __init__(self, hosts: _Optional[_Iterable[_Union[SchedulerHost, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ResolveLostHostRequest(_message.Message):
    __slots__ = ("host_id",)
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    host_id: str
    def __init__(self, host_id: _Optional[str] = ...) -> None: ...

class ResolveLostHostResponse(_message.Message):
    __slots__ = ("host_id", "resolved_tasks", "left_tasks", "host_forgotten", "message")
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    RESOLVED_TASKS_FIELD_NUMBER: _ClassVar[int]
    LEFT_TASKS_FIELD_NUMBER: _ClassVar[int]
    HOST_FORGOTTEN_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    host_id: str
    resolved_tasks: _containers.RepeatedCompositeFieldContainer[Task]
    left_tasks: int
    host_forgotten: bool
    message: str
    def __init__(self, host_id: _Optional[str] = ..., resolved_tasks: _Optional[_Iterable[_Union[Task, _Mapping]]] = ..., left_tasks: _Optional[int] = ..., host_forgotten: _Optional[bool] = ..., message: _Optional[str] = ...) -> None: ...
