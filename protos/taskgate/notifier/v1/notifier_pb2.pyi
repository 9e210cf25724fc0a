import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class NotificationKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NOTIFICATION_KIND_UNSPECIFIED: _ClassVar[NotificationKind]
    NOTIFICATION_KIND_TASK_REPORT: _ClassVar[NotificationKind]
    NOTIFICATION_KIND_TASK_QUESTION: _ClassVar[NotificationKind]
    NOTIFICATION_KIND_REMINDER: _ClassVar[NotificationKind]
NOTIFICATION_KIND_UNSPECIFIED: NotificationKind
NOTIFICATION_KIND_TASK_REPORT: NotificationKind
NOTIFICATION_KIND_TASK_QUESTION: NotificationKind
NOTIFICATION_KIND_REMINDER: NotificationKind

class Notification(_message.Message):
    __slots__ = ("notification_id", "agent_id", "session_id", "kind", "task_id", "body", "handled", "create_time", "attempt_count")
    NOTIFICATION_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    HANDLED_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_COUNT_FIELD_NUMBER: _ClassVar[int]
    notification_id: str
    agent_id: str
    session_id: str
    kind: NotificationKind
    task_id: str
    body: str
    handled: bool
    create_time: _timestamp_pb2.Timestamp
    attempt_count: int
    def __init__(self, notification_id: _Optional[str] = ..., agent_id: _Optional[str] = ..., session_id: _Optional[str] = ..., kind: _Optional[_Union[NotificationKind, str]] = ..., task_id: _Optional[str] = ..., body: _Optional[str] = ..., handled: _Optional[bool] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., attempt_count: _Optional[int] = ...) -> None: ...

class Message(_message.Message):
    __slots__ = ("message_id", "response_id", "role", "text", "create_time", "complete_time")
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_TIME_FIELD_NUMBER: _ClassVar[int]
    message_id: str
    response_id: str
    role: str
    text: str
    create_time: _timestamp_pb2.Timestamp
    complete_time: _timestamp_pb2.Timestamp
    def __init__(self, message_id: _Optional[str] = ..., response_id: _Optional[str] = ..., role: _Optional[str] = ..., text: _Optional[str] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., complete_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ResponseSnapshot(_message.Message):
    __slots__ = ("response_id", "text", "final")
    RESPONSE_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    response_id: str
    text: str
    final: bool
    def __init__(self, response_id: _Optional[str] = ..., text: _Optional[str] = ..., final: _Optional[bool] = ...) -> None: ...

class EnqueueNotificationRequest(_message.Message):
    __slots__ = ("agent_id", "session_id", "kind", "task_id", "body", "request_id")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    session_id: str
    kind: NotificationKind
    task_id: str
    body: str
    request_id: str
    def __init__(self, agent_id: _Optional[str] = ..., session_id: _Optional[str] = ..., kind: _Optional[_Union[NotificationKind, str]] = ..., task_id: _Optional[str] = ..., body: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class EnqueueNotificationResponse(_message.Message):
    __slots__ = ("notification",)
    NOTIFICATION_FIELD_NUMBER: _ClassVar[int]
    notification: Notification
    def __init__(self, notification: _Optional[_Union[Notification, _Mapping]] = ...) -> None: ...

class ListNotificationsRequest(_message.Message):
    __slots__ = ("agent_id", "session_id", "page_size", "page_token")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    session_id: str
    page_size: int
    page_token: str
    def __init__(self, agent_id: _Optional[str] = ..., session_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListNotificationsResponse(_message.Message):
    __slots__ = ("notifications", "next_page_token")
    NOTIFICATIONS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    notifications: _containers.RepeatedCompositeFieldContainer[Notification]
    next_page_token: str
    def __init__(self, notifications: _Optional[_Iterable[_Union[Notification, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ListMessagesRequest(_message.Message):
    __slots__ = ("agent_id", "session_id", "page_size", "page_token")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    session_id: str
    page_size: int
    page_token: str
    def __init__(self, agent_id: _Optional[str] = ..., session_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListMessagesResponse(_message.Message):
    __slots__ = ("messages", "next_page_token")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[Message]
    next_page_token: str
    def __init__(self, messages: _Optional[_Iterable[_Union[Message, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class PublishResponseRequest(_message.Message):
    __slots__ = ("agent_id", "session_id", "snapshot")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    session_id: str
    snapshot: ResponseSnapshot
    def __init__(self, agent_id: _Optional[str] = ..., session_id: _Optional[str] = ..., snapshot: _Optional[_Union[ResponseSnapshot, _Mapping]] = ...) -> None: ...

class PublishResponseResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StreamActivityRequest(_message.Message):
    __slots__ = ("agent_id", "session_id")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    session_id: str
    def __init__(self, agent_id: _Optional[str] = ..., session_id: _Optional[str] = ...) -> None: ...

class StreamActivityResponse(_message.Message):
    __slots__ = ("sequence", "snapshot")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    snapshot: ResponseSnapshot
    def __init__(self, sequence: _Optional[int] = ..., snapshot: _Optional[_Union[ResponseSnapshot, _Mapping]] = ...) -> None: ...
