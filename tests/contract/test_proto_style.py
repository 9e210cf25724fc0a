"""Buf/AIP style rules the protos keep: versioned packages, UNSPECIFIED zero values,
one Request/Response per RPC, streaming RPCs declared."""

from __future__ import annotations

import importlib

import pytest
from google.protobuf.descriptor import FileDescriptor

MODULES = {
    "scheduler": "taskgate.scheduler.v1.scheduler_pb2",
    "pending": "taskgate.pending.v1.pending_pb2",
    "telemetry": "taskgate.telemetry.v1.telemetry_pb2",
    "notifier": "taskgate.notifier.v1.notifier_pb2",
}
STREAMING = {
    ("scheduler", "SchedulerService", "WatchTasks"),
    ("pending", "PendingRegistryService", "Listen"),
    ("telemetry", "TelemetryAgentService", "StreamObservations"),
    ("notifier", "NotifierService", "StreamActivity"),
}


def descriptor(name: str) -> FileDescriptor:
    return importlib.import_module(MODULES[name]).DESCRIPTOR  # type: ignore[no-any-return]


@pytest.mark.parametrize("name", sorted(MODULES))
def test_package_is_versioned_and_matches_the_directory(name: str) -> None:
    fd = descriptor(name)
    assert fd.package == f"taskgate.{name}.v1"
    assert fd.name.startswith(f"taskgate/{name}/v1/")


def _enums(fd: FileDescriptor) -> list:
    found = list(fd.enum_types_by_name.values())
    for message in fd.message_types_by_name.values():
        found.extend(message.enum_types)
    return found


@pytest.mark.parametrize("name", sorted(MODULES))
def test_enum_zero_values_are_unspecified(name: str) -> None:
    for enum in _enums(descriptor(name)):
        zero = enum.values_by_number[0].name
        assert zero.endswith("_UNSPECIFIED"), f"{enum.full_name}: {zero}"
        prefix = zero.removesuffix("UNSPECIFIED")
        assert all(v.name.startswith(prefix) for v in enum.values), f"{enum.full_name} values are not prefixed"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_each_rpc_has_its_own_request_and_response(name: str) -> None:
    for service in descriptor(name).services_by_name.values():
        for method in service.methods:
            assert method.input_type.name == f"{method.name}Request", method.full_name
            assert method.output_type.name == f"{method.name}Response", method.full_name


def test_the_streaming_rpcs_are_declared() -> None:
    for name, service, method in STREAMING:
        m = descriptor(name).services_by_name[service].methods_by_name[method]
        assert m.server_streaming, f"{service}.{method} must be server-streaming"
