"""The worker SDK against grpc_testing's channel: what it sends, how it retries, how it fails."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import grpc
import grpc_testing
import pytest

from libs.worker_sdk import TOKEN_METADATA_KEY, Worker, WorkerError, read_token
from taskgate.scheduler.v1 import scheduler_pb2 as pb

SERVICE = pb.DESCRIPTOR.services_by_name["WorkerService"]


def method(name: str) -> Any:
    return SERVICE.methods_by_name[name]


def in_thread(fn: Callable[[], Any]) -> Future[Any]:
    future: Future[Any] = Future()

    def run() -> None:
        try:
            future.set_result(fn())
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            future.set_exception(exc)

    threading.Thread(target=run, daemon=True).start()
    return future


@pytest.fixture
def channel() -> Any:
    return grpc_testing.channel([SERVICE], grpc_testing.strict_real_time())


def serve_assignment(channel: Any, **fields: Any) -> tuple[Any, Any]:
    metadata, request, rpc = channel.take_unary_unary(method("GetAssignment"))
    rpc.terminate(
        pb.GetAssignmentResponse(task_id="t1", attempt_id="a1", title="T", instructions="do it", **fields),
        (),
        grpc.StatusCode.OK,
        "",
    )
    return metadata, request


def connect(channel: Any) -> Worker:
    pending = in_thread(lambda: Worker(channel, "secret-token", retries=2))
    metadata, _ = serve_assignment(channel, resume=True, last_progress="half")
    worker = pending.result(timeout=5)
    assert (TOKEN_METADATA_KEY, "secret-token") in metadata
    return worker


def test_from_env_needs_the_worker_api_address_and_the_token_pipe() -> None:
    with pytest.raises(WorkerError, match="TASKGATE_WORKER_ADDR"):
        Worker.from_env({})
    with pytest.raises(WorkerError, match="TASKGATE_WORKER_TOKEN_FD"):
        Worker.from_env({"TASKGATE_WORKER_ADDR": "unix:/nonexistent"})


def test_the_token_is_read_once_from_its_pipe_and_the_pipe_closed() -> None:
    r, w = os.pipe()
    os.write(w, b"secret-token")
    os.close(w)
    assert read_token(r) == "secret-token"
    with pytest.raises(OSError):
        os.fstat(r)  # closed: nothing else in the process can read it again
    r, w = os.pipe()
    os.close(w)
    with pytest.raises(WorkerError, match="already read"):
        read_token(r)


def test_the_assignment_and_reports_carry_the_token(channel: Any) -> None:
    worker = connect(channel)
    assert (worker.task_id, worker.instructions, worker.resumed) == ("t1", "do it", True)
    assert worker.assignment.last_progress == "half"

    done = in_thread(lambda: worker.tool("bash", "error", exit_code=2))
    metadata, request, rpc = channel.take_unary_unary(method("ReportTool"))
    rpc.terminate(pb.ReportToolResponse(), (), grpc.StatusCode.OK, "")
    done.result(timeout=5)
    assert (TOKEN_METADATA_KEY, "secret-token") in metadata
    assert request.name == "bash" and request.status == pb.TOOL_STATUS_ERROR and request.exit_code == 2

    done = in_thread(lambda: worker.tool("read"))
    _, request, rpc = channel.take_unary_unary(method("ReportTool"))
    rpc.terminate(pb.ReportToolResponse(), (), grpc.StatusCode.OK, "")
    done.result(timeout=5)
    assert not request.HasField("exit_code"), "no exit code unless one is given"

    done = in_thread(lambda: worker.usage(input_tokens=5))
    _, request, rpc = channel.take_unary_unary(method("ReportUsage"))
    rpc.terminate(pb.ReportUsageResponse(), (), grpc.StatusCode.OK, "")
    done.result(timeout=5)
    assert request.HasField("input_tokens") and not request.HasField("output_tokens")


def test_unavailable_is_retried_and_permission_denied_is_not(channel: Any) -> None:
    worker = connect(channel)
    done = in_thread(lambda: worker.progress("p"))
    for _ in range(2):
        _, _, rpc = channel.take_unary_unary(method("ReportProgress"))
        rpc.terminate(pb.ReportProgressResponse(), (), grpc.StatusCode.UNAVAILABLE, "restarting")
    _, request, rpc = channel.take_unary_unary(method("ReportProgress"))
    rpc.terminate(pb.ReportProgressResponse(), (), grpc.StatusCode.OK, "")
    done.result(timeout=10)
    assert request.text == "p"

    failing = in_thread(lambda: worker.progress("late"))
    _, _, rpc = channel.take_unary_unary(method("ReportProgress"))
    rpc.terminate(pb.ReportProgressResponse(), (), grpc.StatusCode.PERMISSION_DENIED, "stale token")
    with pytest.raises(WorkerError, match="PERMISSION_DENIED: stale token"):
        failing.result(timeout=5)


def test_ask_waits_through_long_polls_and_restarts(channel: Any) -> None:
    worker = connect(channel)
    answer = in_thread(lambda: worker.ask("which one?", poll_s=1))
    _, request, rpc = channel.take_unary_unary(method("AskQuestion"))
    assert request.text == "which one?"
    rpc.terminate(pb.AskQuestionResponse(question_id="q" * 32, revision=1), (), grpc.StatusCode.OK, "")
    _, request, rpc = channel.take_unary_unary(method("AwaitAnswer"))
    assert request.question_id == "q" * 32 and request.max_wait.ToMilliseconds() == 1000
    rpc.terminate(pb.AwaitAnswerResponse(answered=False), (), grpc.StatusCode.OK, "")
    _, _, rpc = channel.take_unary_unary(method("AwaitAnswer"))
    rpc.terminate(pb.AwaitAnswerResponse(), (), grpc.StatusCode.UNAVAILABLE, "registry restarting")
    _, _, rpc = channel.take_unary_unary(method("AwaitAnswer"))
    rpc.terminate(pb.AwaitAnswerResponse(answered=True, answer="the blue one"), (), grpc.StatusCode.OK, "")
    assert answer.result(timeout=10) == "the blue one"
