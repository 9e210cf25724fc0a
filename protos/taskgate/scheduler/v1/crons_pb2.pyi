import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from taskgate.scheduler.v1 import scheduler_pb2 as _scheduler_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CronRunKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CRON_RUN_KIND_UNSPECIFIED: _ClassVar[CronRunKind]
    CRON_RUN_KIND_SCHEDULE: _ClassVar[CronRunKind]
    CRON_RUN_KIND_MANUAL: _ClassVar[CronRunKind]

class CronRunOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CRON_RUN_OUTCOME_UNSPECIFIED: _ClassVar[CronRunOutcome]
    CRON_RUN_OUTCOME_COMPLETED: _ClassVar[CronRunOutcome]
    CRON_RUN_OUTCOME_FAILED: _ClassVar[CronRunOutcome]
    CRON_RUN_OUTCOME_CANCELLED: _ClassVar[CronRunOutcome]
    CRON_RUN_OUTCOME_TIMED_OUT: _ClassVar[CronRunOutcome]
CRON_RUN_KIND_UNSPECIFIED: CronRunKind
CRON_RUN_KIND_SCHEDULE: CronRunKind
CRON_RUN_KIND_MANUAL: CronRunKind
CRON_RUN_OUTCOME_UNSPECIFIED: CronRunOutcome
CRON_RUN_OUTCOME_COMPLETED: CronRunOutcome
CRON_RUN_OUTCOME_FAILED: CronRunOutcome
CRON_RUN_OUTCOME_CANCELLED: CronRunOutcome
CRON_RUN_OUTCOME_TIMED_OUT: CronRunOutcome

class CronJob(_message.Message):
    __slots__ = ("cron_id", "schedule", "agent_id", "session_id", "title", "profile", "timeout_ms", "enabled", "next_run_time")
    CRON_ID_FIELD_NUMBER: _ClassVar[int]
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    NEXT_RUN_TIME_FIELD_NUMBER: _ClassVar[int]
    cron_id: str
    schedule: str
    agent_id: str
    session_id: str
    title: str
    profile: str
    timeout_ms: int
    enabled: bool
    next_run_time: _timestamp_pb2.Timestamp
    def __init__(self, cron_id: _Optional[str] = ..., schedule: _Optional[str] = ..., agent_id: _Optional[str] = ..., session_id: _Optional[str] = ..., title: _Optional[str] = ..., profile: _Optional[str] = ..., timeout_ms: _Optional[int] = ..., enabled: _Optional[bool] = ..., next_run_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class CronRun(_message.Message):
    __slots__ = ("run_id", "cron_id", "kind", "scheduled_time", "start_time", "end_time", "outcome", "task_ids", "failure", "deadline_time")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    CRON_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    SCHEDULED_TIME_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    TASK_IDS_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_TIME_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    cron_id: str
    kind: CronRunKind
    scheduled_time: _timestamp_pb2.Timestamp
    start_time: _timestamp_pb2.Timestamp
    end_time: _timestamp_pb2.Timestamp
    outcome: CronRunOutcome
    task_ids: _containers.RepeatedScalarFieldContainer[str]
    failure: _scheduler_pb2.Failure
    deadline_time: _timestamp_pb2.Timestamp
    def __init__(self, run_id: _Optional[str] = ..., cron_id: _Optional[str] = ..., kind: _Optional[_Union[CronRunKind, str]] = ..., scheduled_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., end_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., outcome: _Optional[_Union[CronRunOutcome, str]] = ..., task_ids: _Optional[_Iterable[str]] = ..., failure: _Optional[_Union[_scheduler_pb2.Failure, _Mapping]] = ..., deadline_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ListCronsRequest(_message.Message):
    __slots__ = ("agent_ids", "all_agents")
    AGENT_IDS_FIELD_NUMBER: _ClassVar[int]
    ALL_AGENTS_FIELD_NUMBER: _ClassVar[int]
    agent_ids: _containers.RepeatedScalarFieldContainer[str]
    all_agents: bool
    def __init__(self, agent_ids: _Optional[_Iterable[str]] = ..., all_agents: _Optional[bool] = ...) -> None: ...

class ListCronsResponse(_message.Message):
    __slots__ = ("crons",)
    CRONS_FIELD_NUMBER: _ClassVar[int]
    crons: _containers.RepeatedCompositeFieldContainer[CronJob]
    def __init__(self, crons: _Optional[_Iterable[_Union[CronJob, _Mapping]]] = ...) -> None: ...

class ListCronRunsRequest(_message.Message):
    __slots__ = ("cron_id", "agent_ids", "all_agents", "page", "page_size")
    CRON_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_IDS_FIELD_NUMBER: _ClassVar[int]
    ALL_AGENTS_FIELD_NUMBER: _ClassVar[int]
    PAGE_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    cron_id: str
    agent_ids: _containers.RepeatedScalarFieldContainer[str]
    all_agents: bool
    page: int
    page_size: int
    def __init__(self, cron_id: _Optional[str] = ..., agent_ids: _Optional[_Iterable[str]] = ..., all_agents: _Optional[bool] = ..., page: _Optional[int] = ..., page_size: _Optional[int] = ...) -> None: ...

class ListCronRunsResponse(_message.Message):
    __slots__ = ("cron", "page", "pages", "total", "runs")
    CRON_FIELD_NUMBER: _ClassVar[int]
    PAGE_FIELD_NUMBER: _ClassVar[int]
    PAGES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    cron: CronJob
    page: int
    pages: int
    total: int
    runs: _containers.RepeatedCompositeFieldContainer[CronRun]
    def __init__(self, cron: _Optional[_Union[CronJob, _Mapping]] = ..., page: _Optional[int] = ..., pages: _Optional[int] = ..., total: _Optional[int] = ..., runs: _Optional[_Iterable[_Union[CronRun, _Mapping]]] = ...) -> None: ...

class RunCronRequest(_message.Message):
    __slots__ = ("cron_id", "agent_ids", "all_agents")
    CRON_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_IDS_FIELD_NUMBER: _ClassVar[int]
    ALL_AGENTS_FIELD_NUMBER: _ClassVar[int]
    cron_id: str
    agent_ids: _containers.RepeatedScalarFieldContainer[str]
    all_agents: bool
    def __init__(self, cron_id: _Optional[str] = ..., agent_ids: _Optional[_Iterable[str]] = ..., all_agents: _Optional[bool] = ...) -> None: ...

class RunCronResponse(_message.Message):
    __slots__ = ("run", "cron")
    RUN_FIELD_NUMBER: _ClassVar[int]
    CRON_FIELD_NUMBER: _ClassVar[int]
    run: CronRun
    cron: CronJob
    def __init__(self, run: _Optional[_Union[CronRun, _Mapping]] = ..., cron: _Optional[_Union[CronJob, _Mapping]] = ...) -> None: ...
