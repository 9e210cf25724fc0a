import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ProcessIdentity(_message.Message):
    __slots__ = ("pid", "start_time")
    PID_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    pid: int
    start_time: int
    def __init__(self, pid: _Optional[int] = ..., start_time: _Optional[int] = ...) -> None: ...

class ExecutionObservation(_message.Message):
    __slots__ = ("task_id", "observe_time", "available", "reason", "cpu_user_ticks", "cpu_system_ticks", "io_read_count", "io_write_count", "io_read_bytes", "io_write_bytes", "processes", "last_activity_time", "ended", "reason_detail", "root")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    OBSERVE_TIME_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CPU_USER_TICKS_FIELD_NUMBER: _ClassVar[int]
    CPU_SYSTEM_TICKS_FIELD_NUMBER: _ClassVar[int]
    IO_READ_COUNT_FIELD_NUMBER: _ClassVar[int]
    IO_WRITE_COUNT_FIELD_NUMBER: _ClassVar[int]
    IO_READ_BYTES_FIELD_NUMBER: _ClassVar[int]
    IO_WRITE_BYTES_FIELD_NUMBER: _ClassVar[int]
    PROCESSES_FIELD_NUMBER: _ClassVar[int]
    LAST_ACTIVITY_TIME_FIELD_NUMBER: _ClassVar[int]
    ENDED_FIELD_NUMBER: _ClassVar[int]
    REASON_DETAIL_FIELD_NUMBER: _ClassVar[int]
    ROOT_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    observe_time: _timestamp_pb2.Timestamp
    available: bool
    reason: str
    cpu_user_ticks: int
    cpu_system_ticks: int
    io_read_count: int
    io_write_count: int
    io_read_bytes: int
    io_write_bytes: int
    processes: _containers.RepeatedCompositeFieldContainer[ProcessIdentity]
    last_activity_time: _timestamp_pb2.Timestamp
    ended: bool
    reason_detail: str
    root: ProcessIdentity
    def __init__(self, task_id: _Optional[str] = ..., observe_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., available: _Optional[bool] = ..., reason: _Optional[str] = ..., cpu_user_ticks: _Optional[int] = ..., cpu_system_ticks: _Optional[int] = ..., io_read_count: _Optional[int] = ..., io_write_count: _Optional[int] = ..., io_read_bytes: _Optional[int] = ..., io_write_bytes: _Optional[int] = ..., processes: _Optional[_Iterable[_Union[ProcessIdentity, _Mapping]]] = ..., last_activity_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., ended: _Optional[bool] = ..., reason_detail: _Optional[str] = ..., root: _Optional[_Union[ProcessIdentity, _Mapping]] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("task_id", "pid", "pid_start_time")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    PID_START_TIME_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    pid: int
    pid_start_time: int
    def __init__(self, task_id: _Optional[str] = ..., pid: _Optional[int] = ..., pid_start_time: _Optional[int] = ...) -> None: ...

class WatchResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class UnwatchRequest(_message.Message):
    __slots__ = ("task_id",)
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    def __init__(self, task_id: _Optional[str] = ...) -> None: ...

class UnwatchResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WatchedTree(_message.Message):
    __slots__ = ("task_id", "pid", "pid_start_time", "create_time")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    PID_START_TIME_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    pid: int
    pid_start_time: int
    create_time: _timestamp_pb2.Timestamp
    def __init__(self, task_id: _Optional[str] = ..., pid: _Optional[int] = ..., pid_start_time: _Optional[int] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ListWatchesRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListWatchesResponse(_message.Message):
    __slots__ = ("watches", "next_page_token")
    WATCHES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    watches: _containers.RepeatedCompositeFieldContainer[WatchedTree]
    next_page_token: str
    def __init__(self, watches: _Optional[_Iterable[_Union[WatchedTree, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class StreamObservationsRequest(_message.Message):
    __slots__ = ("include_latest", "batch")
    INCLUDE_LATEST_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    include_latest: bool
    batch: bool
    def __init__(self, include_latest: _Optional[bool] = ..., batch: _Optional[bool] = ...) -> None: ...

class StreamObservationsResponse(_message.Message):
    __slots__ = ("observation", "observations")
    OBSERVATION_FIELD_NUMBER: _ClassVar[int]
    OBSERVATIONS_FIELD_NUMBER: _ClassVar[int]
    observation: ExecutionObservation
    observations: _containers.RepeatedCompositeFieldContainer[ExecutionObservation]
    def __init__(self, observation: _Optional[_Union[ExecutionObservation, _Mapping]] = ..., observations: _Optional[_Iterable[_Union[ExecutionObservation, _Mapping]]] = ...) -> None: ...
