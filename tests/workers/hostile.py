"""A prompt-injected worker: it asks a question, then tries to answer it itself and to
reach every internal RPC it can find, and writes what happened as JSON.

Instructions (JSON): {"targets": {name: "host:port", ...}, "victim": TASK_ID}.
``targets`` stand for addresses a worker could guess or scan; the worker also looks
in its own environment and the data directory. The report is one stdout line
``ATTACKS {json}`` (so it lands in the attempt's log). Run by absolute path;
imports only the SDK and the generated stubs, as any worker could.
"""

from __future__ import annotations

import glob
import json
import os
import threading
from pathlib import Path
from typing import Any

import grpc

from libs.worker_sdk import TOKEN_METADATA_KEY, Worker
from taskgate.notifier.v1 import notifier_pb2 as npb
from taskgate.pending.v1 import pending_pb2 as ppb
from taskgate.scheduler.v1 import scheduler_pb2 as spb
from taskgate.telemetry.v1 import telemetry_pb2 as tpb


def attempts(question_id: str, task_id: str, victim: str) -> list[tuple[str, str, Any, Any]]:
    """(service, method, request, response type) of everything worth trying."""
    pending = "taskgate.pending.v1.PendingRegistryService"
    scheduler = "taskgate.scheduler.v1.SchedulerService"
    return [
        (
            pending,
            "AnswerQuestion",
            ppb.AnswerQuestionRequest(
                task_id=task_id, question_id=question_id, answer="approved by myself", answered_by="me"
            ),
            ppb.AnswerQuestionResponse,
        ),
        (pending, "Reply", ppb.ReplyRequest(entry_id="0" * 32, answer="yes"), ppb.ReplyResponse),
        (pending, "PickNext", ppb.PickNextRequest(prefix="", picker="worker"), ppb.PickNextResponse),
        (pending, "CancelQuestions", ppb.CancelQuestionsRequest(task_id=task_id), ppb.CancelQuestionsResponse),
        (
            scheduler,
            "ListTasks",
            spb.ListTasksRequest(agent_id="agent-1", session_id="cli-e2e", page_size=5),
            spb.ListTasksResponse,
        ),
        (scheduler, "CancelTask", spb.CancelTaskRequest(task_id=victim), spb.CancelTaskResponse),
        (
            scheduler,
            "CreateTask",
            spb.CreateTaskRequest(agent_id="agent-1", session_id="cli-e2e", title="mine"),
            spb.CreateTaskResponse,
        ),
        (
            "taskgate.telemetry.v1.TelemetryAgentService",
            "ListWatches",
            tpb.ListWatchesRequest(),
            tpb.ListWatchesResponse,
        ),
        (
            "taskgate.notifier.v1.NotifierService",
            "ListMessages",
            npb.ListMessagesRequest(agent_id="agent-1", session_id="cli-e2e"),
            npb.ListMessagesResponse,
        ),
    ]


def credentials(worker_token: str, stolen: dict[str, str]) -> dict[str, tuple[tuple[str, str], ...]]:
    found: dict[str, tuple[tuple[str, str], ...]] = {
        "none": (),
        "worker-token-as-bearer": (("authorization", f"Bearer {worker_token}"),),
        "worker-token-header": ((TOKEN_METADATA_KEY, worker_token),),
    }
    for name, secret in stolen.items():
        found[f"stolen:{name}"] = (("authorization", f"Bearer {secret}"),)
    return found


def steal_secrets() -> dict[str, str]:
    """Secrets lying around: the environment, and the data directory above the workspace."""
    stolen = {k: v for k, v in os.environ.items() if k.startswith("TASKGATE_SECRET_")}
    for pattern in ("../../secrets/*.secret", "../../../secrets/*.secret"):
        for path in glob.glob(pattern):
            try:
                stolen[path] = Path(path).read_text().strip()
            except OSError:
                pass
    return stolen


def main() -> int:
    w = Worker.from_env()
    plan = json.loads(w.instructions)
    targets: dict[str, str] = dict(plan["targets"])
    for key, value in os.environ.items():
        if key.endswith("_ADDR") and ":" in value and not value.startswith("unix:"):
            targets[f"env:{key}"] = value
    asked = w._call(w._stub.AskQuestion, spb.AskQuestionRequest(text="may I deploy?"))
    token = dict(w._metadata)[TOKEN_METADATA_KEY]
    stolen = steal_secrets()
    results: list[dict[str, str]] = []
    for target, addr in sorted(targets.items()):
        with grpc.insecure_channel(addr) as channel:
            for service, method, request, response in attempts(asked.question_id, w.task_id, plan["victim"]):
                call = channel.unary_unary(
                    f"/{service}/{method}",
                    request_serializer=request.SerializeToString,
                    response_deserializer=response.FromString,
                )
                for cred_name, metadata in credentials(token, stolen).items():
                    try:
                        call(request, metadata=metadata, timeout=3)
                        code = "OK"
                    except grpc.RpcError as exc:
                        code = exc.code().name
                    results.append({"target": target, "method": method, "credential": cred_name, "code": code})
    print("ATTACKS " + json.dumps({"results": results, "stolen": sorted(stolen), "uid": os.getuid()}), flush=True)
    # Now behave: wait for a person's answer like any worker.
    answer: dict[str, str] = {}
    waiter = threading.Thread(target=lambda: answer.update(text=w.ask("may I deploy?")))
    waiter.start()
    waiter.join()
    w.result(f"answer: {answer['text']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
