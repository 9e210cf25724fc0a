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
    NOTIFICATION_KIND_TASK_COMPLETED: _ClassVar[NotificationKind]
    NOTIFICATION_KIND_TASK_FAILED: _ClassVar[NotificationKind]
    NOTIFICATION_KIND_TASK_CANCELLED: _ClassVar[NotificationKind]
    NOTIFICATION_KIND_TASK_NEEDS_RECONCILIATION: _ClassVar[NotificationKind]

class NotificationState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NOTIFICATION_STATE_UNSPECIFIED: _ClassVar[NotificationState]
    NOTIFICATION_STATE_PENDING: _ClassVar[NotificationState]
    NOTIFICATION_STATE_DELIVERED: _ClassVar[NotificationState]
    NOTIFICATION_STATE_STOPPED: _ClassVar[NotificationState]

class AttemptOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ATTEMPT_OUTCOME_UNSPECIFIED: _ClassVar[AttemptOutcome]
    ATTEMPT_OUTCOME_DELIVERED: _ClassVar[AttemptOutcome]
    ATTEMPT_OUTCOME_FAILED: _ClassVar[AttemptOutcome]

class FollowUp(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FOLLOW_UP_UNSPECIFIED: _ClassVar[FollowUp]
    FOLLOW_UP_CONTINUES: _ClassVar[FollowUp]
    FOLLOW_UP_ASKS_USER: _ClassVar[FollowUp]
    FOLLOW_UP_NONE: _ClassVar[FollowUp]
NOTIFICATION_KIND_UNSPECIFIED: NotificationKind
NOTIFICATION_KIND_TASK_REPORT: NotificationKind
NOTIFICATION_KIND_TASK_QUESTION: NotificationKind
NOTIFICATION_KIND_REMINDER: NotificationKind
NOTIFICATION_KIND_TASK_COMPLETED: NotificationKind
NOTIFICATION_KIND_TASK_FAILED: NotificationKind
NOTIFICATION_KIND_TASK_CANCELLED: NotificationKind
NOTIFICATION_KIND_TASK_NEEDS_RECONCILIATION: NotificationKind
NOTIFICATION_STATE_UNSPECIFIED: NotificationState
NOTIFICATION_STATE_PENDING: NotificationState
NOTIFICATION_STATE_DELIVERED: NotificationState
NOTIFICATION_STATE_STOPPED: NotificationState
ATTEMPT_OUTCOME_UNSPECIFIED: AttemptOutcome
ATTEMPT_OUTCOME_DELIVERED: AttemptOutcome
ATTEMPT_OUTCOME_FAILED: AttemptOutcome
FOLLOW_UP_UNSPECIFIED: FollowUp
FOLLOW_UP_CONTINUES: FollowUp
FOLLOW_UP_ASKS_USER: FollowUp
FOLLOW_UP_NONE: FollowUp

class DeliveryAttempt(_message.Message):
    __slots__ = ("attempt_time", "outcome", "http_status", "error")
    ATTEMPT_TIME_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    HTTP_STATUS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    attempt_time: _timestamp_pb2.Timestamp
    outcome: AttemptOutcome
    http_status: int
    error: str
    def __init__(self, attempt_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., outcome: _Optional[_Union[AttemptOutcome, str]] = ..., http_status: _Optional[int] = ..., error: _Optional[str] = ...) -> None: ...

class Notification(_message.Message):
    __slots__ = ("notification_id", "agent_id", "session_id", "kind", "task_id", "text", "handled", "create_time", "attempt_count", "state", "question_id", "attempts", "next_attempt_time", "deliver_time", "channel")
    NOTIFICATION_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    HANDLED_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_COUNT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    QUESTION_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_ATTEMPT_TIME_FIELD_NUMBER: _ClassVar[int]
    DELIVER_TIME_FIELD_NUMBER: _ClassVar[int]
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    notification_id: str
    agent_id: str
    session_id: str
    kind: NotificationKind
    task_id: str
    text: str
    handled: bool
    create_time: _timestamp_pb2.Timestamp
    attempt_count: int
    state: NotificationState
    question_id: str
    attempts: _containers.RepeatedCompositeFieldContainer[DeliveryAttempt]
    next_attempt_time: _timestamp_pb2.Timestamp
    deliver_time: _timestamp_pb2.Timestamp
    channel: str
    def __init__(self, notification_id: _Optional[str] = ..., agent_id: _Optional[str] = ..., session_id: _Optional[str] = ..., kind: _Optional[_Union[NotificationKind, str]] = ..., task_id: _Optional[str] = ..., text: _Optional[str] = ..., handled: _Optional[bool] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., attempt_count: _Optional[int] = ..., state: _Optional[_Union[NotificationState, str]] = ..., question_id: _Optional[str] = ..., attempts: _Optional[_Iterable[_Union[DeliveryAttempt, _Mapping]]] = ..., next_attempt_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., deliver_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., channel: _Optional[str] = ...) -> None: ...

class Message(_message.Message):
    __slots__ = ("message_id", "response_id", "role", "text", "create_time", "complete_time", "notification_id", "follow_up")
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_TIME_FIELD_NUMBER: _ClassVar[int]
    NOTIFICATION_ID_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_UP_FIELD_NUMBER: _ClassVar[int]
    message_id: str
    response_id: str
    role: str
    text: str
    create_time: _timestamp_pb2.Timestamp
    complete_time: _timestamp_pb2.Timestamp
    notification_id: str
    follow_up: FollowUp
    def __init__(self, message_id: _Optional[str] = ..., response_id: _Optional[str] = ..., role: _Optional[str] = ..., text: _Optional[str] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., complete_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., notification_id: _Optional[str] = ..., follow_up: _Optional[_Union[FollowUp, str]] = ...) -> None: ...

class ResponseSnapshot(_message.Message):
    __slots__ = ("response_id", "text", "final")
    RESPONSE_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    response_id: str
    text: str
    final: bool
    def __init__(self, response_id: _Optional[str] = ..., text: _Optional[str] = ..., final: _Optional[bool] = ...) -> None: ...

class Response(_message.Message):
    __slots__ = ("response_id", "text", "final", "create_time", "update_time", "complete_time")
    RESPONSE_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_TIME_FIELD_NUMBER: _ClassVar[int]
    response_id: str
    text: str
    final: bool
    create_time: _timestamp_pb2.Timestamp
    update_time: _timestamp_pb2.Timestamp
    complete_time: _timestamp_pb2.Timestamp
    def __init__(self, response_id: _Optional[str] = ..., text: _Optional[str] = ..., final: _Optional[bool] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., update_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., complete_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ConversationEvent(_message.Message):
    __slots__ = ("kind", "event_time", "data")
    class DataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    KIND_FIELD_NUMBER: _ClassVar[int]
    EVENT_TIME_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    kind: str
    event_time: _timestamp_pb2.Timestamp
    data: _containers.ScalarMap[str, str]
    def __init__(self, kind: _Optional[str] = ..., event_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., data: _Optional[_Mapping[str, str]] = ...) -> None: ...

class EnqueueNotificationRequest(_message.Message):
    __slots__ = ("agent_id", "session_id", "kind", "task_id", "text", "request_id")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    session_id: str
    kind: NotificationKind
    task_id: str
    text: str
    request_id: str
    def __init__(self, agent_id: _Optional[str] = ..., session_id: _Optional[str] = ..., kind: _Optional[_Union[NotificationKind, str]] = ..., task_id: _Optional[str] = ..., text: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class EnqueueNotificationResponse(_message.Message):
    __slots__ = ("notification",)
    NOTIFICATION_FIELD_NUMBER: _ClassVar[int]
    notification: Notification
    def __init__(self, notification: _Optional[_Union[Notification, _Mapping]] = ...) -> None: ...

class ListNotificationsRequest(_message.Message):
    __slots__ = ("agent_id", "session_id", "page_size", "page", "state")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    session_id: str
    page_size: int
    page: int
    state: NotificationState
    def __init__(self, agent_id: _Optional[str] = ..., session_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page: _Optional[int] = ..., state: _Optional[_Union[NotificationState, str]] = ...) -> None: ...

class ListNotificationsResponse(_message.Message):
    __slots__ = ("notifications", "page", "pages", "total")
    NOTIFICATIONS_FIELD_NUMBER: _ClassVar[int]
    PAGE_FIELD_NUMBER: _ClassVar[int]
    PAGES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    notifications: _containers.RepeatedCompositeFieldContainer[Notification]
    page: int
    pages: int
    total: int
    def __init__(self, notifications: _Optional[_Iterable[_Union[Notification, _Mapping]]] = ..., page: _Optional[int] = ..., pages: _Optional[int] = ..., total: _Optional[int] = ...) -> None: ...

class StopNotificationRequest(_message.Message):
    __slots__ = ("agent_id", "session_id", "notification_id")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    NOTIFICATION_ID_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    session_id: str
    notification_id: str
    def __init__(self, agent_id: _Optional[str] = ..., session_id: _Optional[str] = ..., notification_id: _Optional[str] = ...) -> None: ...

class StopNotificationResponse(_message.Message):
    __slots__ = ("notification",)
    NOTIFICATION_FIELD_NUMBER: _ClassVar[int]
    notification: Notification
    def __init__(self, notification: _Optional[_Union[Notification, _Mapping]] = ...) -> None: ...

class ReplyToNotificationRequest(_message.Message):
    __slots__ = ("agent_id", "session_id", "notification_id", "text", "follow_up")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    NOTIFICATION_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_UP_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    session_id: str
    notification_id: str
    text: str
    follow_up: FollowUp
    def __init__(self, agent_id: _Optional[str] = ..., session_id: _Optional[str] = ..., notification_id: _Optional[str] = ..., text: _Optional[str] = ..., follow_up: _Optional[_Union[FollowUp, str]] = ...) -> None: ...

class ReplyToNotificationResponse(_message.Message):
    __slots__ = ("message", "unbacked_promise")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    UNBACKED_PROMISE_FIELD_NUMBER: _ClassVar[int]
    message: Message
    unbacked_promise: bool
    def __init__(self, message: _Optional[_Union[Message, _Mapping]] = ..., unbacked_promise: _Optional[bool] = ...) -> None: ...

class ListMessagesRequest(_message.Message):
    __slots__ = ("agent_id", "session_id", "page_size", "page")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    session_id: str
    page_size: int
    page: int
    def __init__(self, agent_id: _Optional[str] = ..., session_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page: _Optional[int] = ...) -> None: ...

class ListMessagesResponse(_message.Message):
    __slots__ = ("messages", "page", "pages", "total")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    PAGE_FIELD_NUMBER: _ClassVar[int]
    PAGES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[Message]
    page: int
    pages: int
    total: int
    def __init__(self, messages: _Optional[_Iterable[_Union[Message, _Mapping]]] = ..., page: _Optional[int] = ..., pages: _Optional[int] = ..., total: _Optional[int] = ...) -> None: ...

class CreateMessageRequest(_message.Message):
    __slots__ = ("agent_id", "session_id", "text")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    session_id: str
    text: str
    def __init__(self, agent_id: _Optional[str] = ..., session_id: _Optional[str] = ..., text: _Optional[str] = ...) -> None: ...

class CreateMessageResponse(_message.Message):
    __slots__ = ("message", "pending_updates")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PENDING_UPDATES_FIELD_NUMBER: _ClassVar[int]
    message: Message
    pending_updates: _containers.RepeatedCompositeFieldContainer[Notification]
    def __init__(self, message: _Optional[_Union[Message, _Mapping]] = ..., pending_updates: _Optional[_Iterable[_Union[Notification, _Mapping]]] = ...) -> None: ...

class ListConversationEventsRequest(_message.Message):
    __slots__ = ("agent_id", "session_id", "page_size", "page")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    session_id: str
    page_size: int
    page: int
    def __init__(self, agent_id: _Optional[str] = ..., session_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page: _Optional[int] = ...) -> None: ...

class ListConversationEventsResponse(_message.Message):
    __slots__ = ("events", "page", "pages", "total")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    PAGE_FIELD_NUMBER: _ClassVar[int]
    PAGES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[ConversationEvent]
    page: int
    pages: int
    total: int
    def __init__(self, events: _Optional[_Iterable[_Union[ConversationEvent, _Mapping]]] = ..., page: _Optional[int] = ..., pages: _Optional[int] = ..., total: _Optional[int] = ...) -> None: ...

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
    __slots__ = ("response",)
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    response: Response
    def __init__(self, response: _Optional[_Union[Response, _Mapping]] = ...) -> None: ...

class StreamActivityRequest(_message.Message):
    __slots__ = ("agent_id", "session_id", "after_sequence", "live_only")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    LIVE_ONLY_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    session_id: str
    after_sequence: int
    live_only: bool
    def __init__(self, agent_id: _Optional[str] = ..., session_id: _Optional[str] = ..., after_sequence: _Optional[int] = ..., live_only: _Optional[bool] = ...) -> None: ...

class StreamActivityResponse(_message.Message):
    __slots__ = ("sequence", "snapshot", "notification")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    NOTIFICATION_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    snapshot: ResponseSnapshot
    notification: Notification
    def __init__(self, sequence: _Optional[int] = ..., snapshot: _Optional[_Union[ResponseSnapshot, _Mapping]] = ..., notification: _Optional[_Union[Notification, _Mapping]] = ...) -> None: ...

class ReplayActivityRequest(_message.Message):
    __slots__ = ("agent_id", "session_id", "after_sequence")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    session_id: str
    after_sequence: int
    def __init__(self, agent_id: _Optional[str] = ..., session_id: _Optional[str] = ..., after_sequence: _Optional[int] = ...) -> None: ...

class ReplayActivityResponse(_message.Message):
    __slots__ = ("frames", "resumed")
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    RESUMED_FIELD_NUMBER: _ClassVar[int]
    frames: _containers.RepeatedCompositeFieldContainer[StreamActivityResponse]
    resumed: bool
    def __init__(self, frames: _Optional[_Iterable[_Union[StreamActivityResponse, _Mapping]]] = ..., resumed: _Optional[bool] = ...) -> None: ...

class QuestionReminders(_message.Message):
    __slots__ = ("question_id", "task_id", "state", "snooze_until_time", "muted", "reminders_sent")
    QUESTION_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SNOOZE_UNTIL_TIME_FIELD_NUMBER: _ClassVar[int]
    MUTED_FIELD_NUMBER: _ClassVar[int]
    REMINDERS_SENT_FIELD_NUMBER: _ClassVar[int]
    question_id: str
    task_id: str
    state: str
    snooze_until_time: _timestamp_pb2.Timestamp
    muted: bool
    reminders_sent: int
    def __init__(self, question_id: _Optional[str] = ..., task_id: _Optional[str] = ..., state: _Optional[str] = ..., snooze_until_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., muted: _Optional[bool] = ..., reminders_sent: _Optional[int] = ...) -> None: ...

class SnoozeQuestionRequest(_message.Message):
    __slots__ = ("agent_id", "session_id", "question_id")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    QUESTION_ID_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    session_id: str
    question_id: str
    def __init__(self, agent_id: _Optional[str] = ..., session_id: _Optional[str] = ..., question_id: _Optional[str] = ...) -> None: ...

class SnoozeQuestionResponse(_message.Message):
    __slots__ = ("question",)
    QUESTION_FIELD_NUMBER: _ClassVar[int]
    question: QuestionReminders
    def __init__(self, question: _Optional[_Union[QuestionReminders, _Mapping]] = ...) -> None: ...

class MuteQuestionRequest(_message.Message):
    __slots__ = ("agent_id", "session_id", "question_id")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    QUESTION_ID_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    session_id: str
    question_id: str
    def __init__(self, agent_id: _Optional[str] = ..., session_id: _Optional[str] = ..., question_id: _Optional[str] = ...) -> None: ...

class MuteQuestionResponse(_message.Message):
    __slots__ = ("question",)
    QUESTION_FIELD_NUMBER: _ClassVar[int]
    question: QuestionReminders
    def __init__(self, question: _Optional[_Union[QuestionReminders, _Mapping]] = ...) -> None: ...

class ClaimUnreportedFailureRequest(_message.Message):
    __slots__ = ("agent_id", "session_id", "task_id", "event_sequence")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    EVENT_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    session_id: str
    task_id: str
    event_sequence: int
    def __init__(self, agent_id: _Optional[str] = ..., session_id: _Optional[str] = ..., task_id: _Optional[str] = ..., event_sequence: _Optional[int] = ...) -> None: ...

class ClaimUnreportedFailureResponse(_message.Message):
    __slots__ = ("claimed", "outcome")
    CLAIMED_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    claimed: bool
    outcome: str
    def __init__(self, claimed: _Optional[bool] = ..., outcome: _Optional[str] = ...) -> None: ...
