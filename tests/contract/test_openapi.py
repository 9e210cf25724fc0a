"""The published /openapi.json: the Task schema, the bearer scheme, and one error shape."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway_http.app import create_app
from gateway_http.store import MIGRATIONS, GatewayStore
from libs.db import Database
from libs.settings import load_settings

API_PREFIXES = ("/api/v1/", "/v1/session/")


@pytest.fixture
async def document(tmp_path: Path) -> dict[str, Any]:
    settings = load_settings({"TASKGATE_DATA_DIR": str(tmp_path)})
    db = Database(f"sqlite:///{tmp_path}/gateway.db", MIGRATIONS)
    app = create_app(settings, GatewayStore(db))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as client:
        response = await client.get("/openapi.json")
    db.close()
    assert response.status_code == 200
    doc: dict[str, Any] = response.json()
    doc["x-profiles"] = sorted(settings.workers)
    return doc


def operations(doc: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(path, method, op) for path, ops in doc["paths"].items() for method, op in ops.items()]


def test_the_task_schema_is_published(document: dict[str, Any]) -> None:
    schemas = document["components"]["schemas"]
    task = schemas["Task"]
    assert {"taskId", "state", "timing", "attempts", "workspace"} <= set(task["required"])
    assert {"progress", "failure", "result", "pendingQuestion", "execution"} <= set(task["properties"])
    assert "queued" in task["properties"]["state"]["enum"]
    assert task["additionalProperties"] is False
    envelope = document["paths"]["/api/v1/agents/{agentId}/sessions/{sessionId}/tasks/{taskId}"]["get"]
    ok = envelope["responses"]["200"]["content"]["application/json"]["schema"]
    assert ok == {"$ref": "#/components/schemas/TaskEnvelope"}
    assert schemas["TaskEnvelope"]["properties"]["task"] == {"$ref": "#/components/schemas/Task"}


def test_the_bearer_scheme_guards_every_api_operation(document: dict[str, Any]) -> None:
    schemes = document["components"]["securitySchemes"]
    assert schemes == {"apiKey": {"type": "http", "scheme": "bearer", "description": schemes["apiKey"]["description"]}}
    for path, method, op in operations(document):
        if path.startswith(API_PREFIXES):
            assert op.get("security") == [{"apiKey": []}], (method, path)
            assert "401" in op["responses"], (method, path)


def test_every_error_answer_is_the_error_body(document: dict[str, Any]) -> None:
    assert "HTTPValidationError" not in document["components"]["schemas"]
    for path, method, op in operations(document):
        assert "422" not in op["responses"], (method, path)
        for status, response in op["responses"].items():
            if int(status) >= 400 and path != "/healthz":
                schema = response["content"]["application/json"]["schema"]
                assert schema == {"$ref": "#/components/schemas/ErrorBody"}, (method, path, status)
    assert document["components"]["schemas"]["ErrorBody"]["required"] == ["error", "message"]


def test_ids_and_parameters_carry_their_formats(document: dict[str, Any]) -> None:
    patterns = {}
    for _, _, op in operations(document):
        for parameter in op.get("parameters", []):
            patterns[(parameter["in"], parameter["name"])] = parameter["schema"]
    assert patterns[("path", "taskId")]["pattern"] == "^[0-9a-f]{32}$"
    assert patterns[("path", "agentId")]["pattern"] == "^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
    assert patterns[("path", "sessionId")]["maxLength"] == 128
    page_size = patterns[("query", "page_size")]
    assert (page_size["type"], page_size["minimum"], page_size["maximum"], page_size["default"]) == (
        "integer",
        1,
        100,
        10,
    )
    assert patterns[("query", "all")]["type"] == "boolean"
    assert "agentId" in {name for (where, name) in patterns if where == "query"}
    body = document["components"]["schemas"]["CreateTaskBody"]
    profile = next(o for o in body["properties"]["profile"]["anyOf"] if o.get("type") == "string")
    assert profile["enum"] == document["x-profiles"]
    assert body["additionalProperties"] is False


def test_created_tasks_link_to_their_operations(document: dict[str, Any]) -> None:
    created = document["paths"]["/api/v1/agents/{agentId}/sessions/{sessionId}/tasks"]["post"]["responses"]["201"]
    assert len(created["links"]) == 8  # get, its event stream, log, cancel, pause, resume, retry-cleanup, answer
    assert any(op.startswith("task_detail_events_") for op in created["links"])
    for link in created["links"].values():
        assert link["parameters"]["taskId"] == "$response.body#/task/taskId"


def test_every_answer_documents_the_request_id_header(document: dict[str, Any]) -> None:
    for path, method, op in operations(document):
        for response in op["responses"].values():
            header = response["headers"]["X-Request-Id"]
            assert header["required"] and header["schema"]["pattern"] == "^[A-Za-z0-9._:-]{1,64}$", (method, path)


def test_every_api_operation_documents_the_backend_errors(document: dict[str, Any]) -> None:
    for path, method, op in operations(document):
        if path.startswith(API_PREFIXES):
            assert {"400", "401", "403", "500", "503", "504"} <= set(op["responses"]), (method, path)
            if "requestBody" in op:
                assert "413" in op["responses"], (method, path)


async def test_the_kinds_of_task_are_described(tmp_path: Path) -> None:
    """Issue 13's bodies: continuation, skills, routing enums from the configuration, the tree."""
    skill = tmp_path / "skill.md"
    skill.write_text("body")
    config = tmp_path / "taskgate.toml"
    config.write_text(
        "[workers.default-worker]\ncommand = ['true']\n"
        "[workers.codex]\ncommand = ['true']\nharness = 'codex'\nharness_model = 'gpt-x'\n"
        f"[skills.review]\nprofile = 'codex'\ninstructions_file = '{skill}'\n"
    )
    settings = load_settings({"TASKGATE_DATA_DIR": str(tmp_path), "TASKGATE_CONFIG": str(config)})
    db = Database(f"sqlite:///{tmp_path}/gateway.db", MIGRATIONS)
    app = create_app(settings, GatewayStore(db))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as client:
        doc = (await client.get("/openapi.json")).json()
    db.close()
    schemas = doc["components"]["schemas"]
    body = schemas["CreateTaskBody"]["properties"]
    assert body["continueTaskId"]["anyOf"][0]["pattern"] == "^[0-9a-f]{32}$"
    assert {"enum": ["codex"]}.items() <= body["harness"]["anyOf"][0].items()
    assert body["harnessModel"]["anyOf"][0]["enum"] == ["gpt-x"]
    assert schemas["SkillInvocation"]["properties"]["name"]["enum"] == ["review"]
    task = schemas["Task"]["properties"]
    assert {"continueTaskId", "continuedByTaskId", "parentTaskId", "skill", "subagents", "evidence"} <= set(task)
    assert set(schemas["SkillRef"]["properties"]) == {"name", "args", "invocation"}, "never a body or a path"
    assert {"skills", "subagents", "subagentModels", "toolCounts", "observedPaths"} <= set(
        schemas["Evidence"]["properties"]
    )
    assert {"retryable", "continueTaskId"} <= set(schemas["ErrorBody"]["properties"])
    assert set(schemas["TargetBody"]["properties"]) == {"name", "nativeSessionId", "displayName", "options"}
    assert {"gatewayTarget", "gatewayDispatch"} <= set(task)
    assert set(schemas["GatewayDispatch"]["properties"]) == {"requestId", "submittedAt"}
    assert set(doc["paths"]["/api/v1/agents/{agentId}/targets"]) == {"get"}, "discovery only: REST changes no grant"
    assert not [path for path in doc["paths"] if "safemode" in path or "dispatch" in path]


def test_without_configured_harnesses_or_skills_only_null_is_valid(document: dict[str, Any]) -> None:
    body = document["components"]["schemas"]["CreateTaskBody"]["properties"]
    assert body["harness"]["anyOf"] == [{"type": "null"}]
    assert body["skill"]["type"] == "null"
    assert body["target"]["type"] == "null"
