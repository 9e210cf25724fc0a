"""The worker SDK: what a worker process uses to talk to taskgate.

    from libs.worker_sdk import Worker
    w = Worker.from_env()
    w.progress("reading the repository")
    w.result("done")

Synchronous on purpose: workers are ordinary scripts. Every call carries the
per-attempt worker token; transient unavailability is retried with backoff.

The worker API's address comes in ``TASKGATE_WORKER_ADDR`` (a Unix socket that
serves only the worker API). The token comes through an inherited pipe named by
``TASKGATE_WORKER_TOKEN_FD``, read once and closed — never through the
environment, which same-user processes can read from ``/proc/<pid>/environ``.
Before reading it the SDK marks the process non-dumpable, so a same-user sibling
cannot read its memory or its open files through ``/proc`` either.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
from google.protobuf.duration_pb2 import Duration

from taskgate.scheduler.v1 import scheduler_pb2 as pb
from taskgate.scheduler.v1 import scheduler_pb2_grpc as pb_grpc

TOKEN_METADATA_KEY = "x-taskgate-worker-token"
ADDR_ENV = "TASKGATE_WORKER_ADDR"
TOKEN_FD_ENV = "TASKGATE_WORKER_TOKEN_FD"
_PR_SET_DUMPABLE = 4
_RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}
T = TypeVar("T")


class WorkerError(Exception):
    """A report the scheduler refused (bad token, finished task, bad input)."""


@dataclass(frozen=True)
class Assignment:
    task_id: str
    attempt_id: str
    title: str
    instructions: str
    resume: bool
    last_progress: str
    # A skill task: the skill's name and its arguments (the instructions are its body).
    skill_name: str = ""
    skill_args: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SubTask:
    """A sub-task's state as seen by its parent's worker (``Worker.spawn``/``wait``)."""

    task_id: str
    state: str
    finished: bool = False
    result: str = ""
    failure_code: str = ""


def _state_name(value: int) -> str:
    return str(pb.TaskState.Name(value)).removeprefix("TASK_STATE_").lower()


def read_token(fd: int) -> str:
    """Read the worker token once from the pipe taskgate handed over, then close it."""
    _not_dumpable()
    chunks = []
    try:
        while chunk := os.read(fd, 4096):
            chunks.append(chunk)
    except OSError as exc:
        raise WorkerError(f"cannot read the worker token from fd {fd}: {exc.strerror}") from exc
    finally:
        try:
            os.close(fd)
        except OSError:
            pass
    os.environ.pop(TOKEN_FD_ENV, None)  # children must not take the number for the pipe
    token = b"".join(chunks).decode().strip()
    if not token:
        raise WorkerError("the worker token was already read (by this process or another)")
    return token


def _not_dumpable() -> None:
    """Same-user processes lose access to this process's /proc files (memory, fds, environ)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the pipe still keeps the token out of the environment


class Worker:
    def __init__(
        self,
        channel: grpc.Channel,
        token: str,
        *,
        timeout_s: float = 10.0,
        retries: int = 5,
    ) -> None:
        self._stub = pb_grpc.WorkerServiceStub(channel)
        self._channel = channel
        self._metadata = ((TOKEN_METADATA_KEY, token),)
        self._timeout_s = timeout_s
        self._retries = retries
        response = self._call(self._stub.GetAssignment, pb.GetAssignmentRequest())
        self.assignment = Assignment(
            task_id=response.task_id,
            attempt_id=response.attempt_id,
            title=response.title,
            instructions=response.instructions,
            resume=response.resume,
            last_progress=response.last_progress,
            skill_name=response.skill_name,
            skill_args=json.loads(response.skill_args_json) if response.skill_args_json else {},
        )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Worker:
        """Connect as the worker taskgate started: the address from the environment, the token from its pipe."""
        env = os.environ if environ is None else environ
        try:
            addr = env[ADDR_ENV]
            fd = int(env[TOKEN_FD_ENV])
        except KeyError as exc:
            raise WorkerError(f"{exc.args[0]} is not set: this process was not started by taskgate") from exc
        except ValueError as exc:
            raise WorkerError(f"{TOKEN_FD_ENV} is not a file descriptor number") from exc
        return cls(grpc.insecure_channel(addr), read_token(fd))

    @property
    def task_id(self) -> str:
        return self.assignment.task_id

    @property
    def instructions(self) -> str:
        return self.assignment.instructions

    @property
    def resumed(self) -> bool:
        return self.assignment.resume

    def progress(self, text: str) -> None:
        self._call(self._stub.ReportProgress, pb.ReportProgressRequest(text=text))

    def tool(self, name: str, status: str = "returned", exit_code: int | None = None) -> None:
        statuses = {"returned": pb.TOOL_STATUS_RETURNED, "error": pb.TOOL_STATUS_ERROR}
        if status not in statuses:
            raise ValueError("status must be 'returned' or 'error'")
        request = pb.ReportToolRequest(name=name, status=statuses[status])
        if exit_code is not None:
            request.exit_code = int(exit_code)
        self._call(self._stub.ReportTool, request)

    def touched(self, *paths: str) -> None:
        self._call(self._stub.ReportTouched, pb.ReportTouchedRequest(paths=list(paths)))

    def usage(
        self,
        input_tokens: int | None = None,
        cached_input_tokens: int | None = None,
        output_tokens: int | None = None,
        delta: bool = False,
    ) -> None:
        """Token counters: by default the attempt's totals so far (each report replaces the
        last); ``delta=True`` says they are increments, which taskgate adds up."""
        request = pb.ReportUsageRequest(delta=delta)
        if input_tokens is not None:
            request.input_tokens = input_tokens
        if cached_input_tokens is not None:
            request.cached_input_tokens = cached_input_tokens
        if output_tokens is not None:
            request.output_tokens = output_tokens
        self._call(self._stub.ReportUsage, request)

    def result(self, text: str, unresolved_background: bool = False) -> None:
        self._call(
            self._stub.ReportResult,
            pb.ReportResultRequest(text=text, unresolved_background=unresolved_background),
        )

    def ask(self, text: str, poll_s: float = 25.0) -> str:
        """Ask the task's humans a question and block until the answer arrives.

        The task shows ``waiting_input`` meanwhile. Survives restarts of the
        pending-registry and the scheduler (calls are retried until they answer);
        a resumed worker asking the same question gets the answer saved while it
        was down.
        """
        asked = self._call(self._stub.AskQuestion, pb.AskQuestionRequest(text=text), patient=True)
        wait = Duration()
        wait.FromMilliseconds(int(poll_s * 1000))
        request = pb.AwaitAnswerRequest(question_id=asked.question_id, max_wait=wait)
        while True:
            reply = self._call(self._stub.AwaitAnswer, request, timeout_s=poll_s + 10, patient=True)
            if reply.answered:
                return str(reply.answer)

    def spawn(self, title: str, instructions: str = "", profile: str = "", request_id: str = "") -> SubTask:
        """Start a sub-task of this worker's task (same session; ``profile`` empty: this one's).

        Bounded by the scheduler's depth and fan-out settings (WorkerError INVALID_ARGUMENT).
        """
        reply = self._call(
            self._stub.SpawnTask,
            pb.SpawnTaskRequest(title=title, instructions=instructions, profile=profile, request_id=request_id),
        )
        return SubTask(task_id=reply.task_id, state=_state_name(reply.state))

    def wait(self, task_id: str, timeout_s: float | None = None, poll_s: float = 25.0) -> SubTask:
        """Block until the sub-task has finished (or ``timeout_s`` passed); its latest state."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            left = poll_s if deadline is None else max(0.1, min(poll_s, deadline - time.monotonic()))
            wait = Duration()
            wait.FromMilliseconds(int(left * 1000))
            reply = self._call(
                self._stub.WaitSubtask,
                pb.WaitSubtaskRequest(task_id=task_id, max_wait=wait),
                timeout_s=left + 10,
                patient=True,
            )
            sub = SubTask(
                task_id=reply.task_id,
                state=_state_name(reply.state),
                finished=reply.finished,
                result=reply.result_text,
                failure_code=reply.failure_code,
            )
            if sub.finished or (deadline is not None and time.monotonic() >= deadline):
                return sub

    def cancel(self, task_id: str) -> SubTask:
        """Cancel one of this task's sub-tasks (its own sub-tasks first), with proof."""
        reply = self._call(self._stub.CancelSubtask, pb.CancelSubtaskRequest(task_id=task_id))
        return SubTask(task_id=reply.task_id, state=_state_name(reply.state))

    def close(self) -> None:
        self._channel.close()

    def _call(self, method: Callable[..., T], request: Any, timeout_s: float | None = None, patient: bool = False) -> T:
        """One report; UNAVAILABLE/DEADLINE_EXCEEDED are retried (forever when ``patient``)."""
        delay = 0.2
        attempt = 0
        while True:
            attempt += 1
            try:
                return method(request, metadata=self._metadata, timeout=timeout_s or self._timeout_s)
            except grpc.RpcError as exc:
                code = exc.code() if hasattr(exc, "code") else None
                if code in _RETRYABLE and (patient or attempt <= self._retries):
                    time.sleep(delay)
                    delay = min(delay * 2, 2.0)
                    continue
                details = exc.details() if hasattr(exc, "details") else str(exc)
                raise WorkerError(f"{code.name if code else 'ERROR'}: {details}") from exc
