"""The published response models describe exactly what ``convert`` produces."""

from __future__ import annotations

from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from pydantic import BaseModel

from gateway_http.convert import task_json
from gateway_http.schemas import Task
from taskgate.scheduler.v1 import scheduler_pb2 as pb


def fill(message: Message) -> Message:
    """Every field set to a non-default value, every repeated field given one element."""
    for field in message.DESCRIPTOR.fields:
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            continue  # a map (free-form options) is documented as a dict: its key is the field itself
        if field.message_type is not None:
            if field.message_type.full_name == "google.protobuf.Timestamp":
                target = getattr(message, field.name).add() if _repeated(field) else getattr(message, field.name)
                target.FromMilliseconds(1_700_000_000_123)
            elif _repeated(field):
                fill(getattr(message, field.name).add())
            else:
                fill(getattr(message, field.name))
            continue
        value: Any
        if field.enum_type is not None:
            value = field.enum_type.values[-1].number
        elif field.type == FieldDescriptor.TYPE_BOOL:
            value = True
        elif field.type == FieldDescriptor.TYPE_STRING:
            value = "x"
        else:
            value = 7
        if _repeated(field):
            getattr(message, field.name).append(value)
        else:
            setattr(message, field.name, value)
    return message


def _repeated(field: FieldDescriptor) -> bool:
    return bool(field.is_repeated)


def keys(value: Any, prefix: str = "") -> set[str]:
    """Every key path in a JSON value (list items as [])."""
    out: set[str] = set()
    if isinstance(value, dict):
        for key, item in value.items():
            out.add(prefix + key)
            out |= keys(item, f"{prefix}{key}.")
    elif isinstance(value, list):
        for item in value:
            out |= keys(item, f"{prefix}[].")
    return out


def model_keys(model: type[BaseModel], prefix: str = "") -> set[str]:
    out: set[str] = set()
    for name, field in model.model_fields.items():
        out.add(prefix + name)
        for arg in _types(field.annotation):
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                nested = f"{prefix}{name}.[]." if _is_list(field.annotation) else f"{prefix}{name}."
                out |= model_keys(arg, nested)
    return out


def _types(annotation: Any) -> list[Any]:
    args = list(getattr(annotation, "__args__", ()))
    flat: list[Any] = [annotation]
    for arg in args:
        flat += _types(arg)
    return flat


def _is_list(annotation: Any) -> bool:
    return any(getattr(a, "__origin__", None) is list for a in _types(annotation))


def test_a_full_snapshot_validates_and_uses_every_documented_field() -> None:
    full = task_json(fill(pb.Task()))  # type: ignore[arg-type]
    Task.model_validate(full)  # extra fields are forbidden: nothing undocumented
    assert keys(full) == model_keys(Task), "documented fields never produced, or produced but not documented"


def test_a_bare_snapshot_validates() -> None:
    Task.model_validate(task_json(pb.Task(task_id="t", state=pb.TASK_STATE_QUEUED)))
