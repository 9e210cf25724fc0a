"""The published OpenAPI document: what FastAPI derives from the routes, plus what only settings know.

- the worker profiles a task may name (the gateway refuses others before any backend is asked);
- no 422 answers: validation errors are 400 ``{error, message}`` here (``errors.validation_error_handler``);
- error answers as JSON on streaming routes too, and on every authenticated operation the error
  statuses any of them can give (a route that declares fewer still gets them documented);
- the ``X-Request-Id`` header on every answer;
- links from a created task to the operations on it, so clients and fuzzers follow real ids.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI

from gateway_http.errors import DESCRIPTIONS
from gateway_http.middleware import CLIENT_REQUEST_ID
from libs.settings import Settings


def install(app: FastAPI, settings: Settings) -> None:
    generate: Callable[[], dict[str, Any]] = app.openapi

    def document() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = generate()
            _drop_422(doc)
            _errors_as_json(doc)
            _api_errors(doc)
            _request_id_header(doc)
            _profile_enum(doc, sorted(settings.workers))
            _routing_enums(doc, settings)
            _task_links(doc)
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = document  # type: ignore[method-assign]


def _drop_422(doc: dict[str, Any]) -> None:
    for operations in doc.get("paths", {}).values():
        for operation in operations.values():
            if isinstance(operation, dict):
                operation.get("responses", {}).pop("422", None)
    schemas = doc.get("components", {}).get("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)


def _errors_as_json(doc: dict[str, Any]) -> None:
    """Error answers are JSON also where the route streams (FastAPI gives them the route's media type)."""
    for operations in doc.get("paths", {}).values():
        for operation in operations.values():
            for status, response in operation.get("responses", {}).items():
                content = response.get("content", {})
                if status[0] in "45" and "application/json" not in content and content:
                    response["content"] = {"application/json": next(iter(content.values()))}


ERROR_BODY = {"$ref": "#/components/schemas/ErrorBody"}


def _api_errors(doc: dict[str, Any]) -> None:
    for path, operations in doc.get("paths", {}).items():
        for operation in operations.values():
            if not operation.get("security"):
                continue
            statuses = {400, 401, 403, 429, 500, 501, 503, 504}
            if "{" in path:
                statuses.add(404)
            if path.startswith("/api/v1/agents/"):
                statuses.add(409)  # ORCHESTRATION_DISABLED
            if "requestBody" in operation:
                statuses.add(413)
            responses = operation.setdefault("responses", {})
            for status in sorted(statuses):
                responses.setdefault(
                    str(status),
                    {"description": DESCRIPTIONS[status], "content": {"application/json": {"schema": ERROR_BODY}}},
                )


def _request_id_header(doc: dict[str, Any]) -> None:
    header = {
        "description": "the request's id: the client's X-Request-Id when well formed, else a new one",
        "required": True,
        "schema": {"type": "string", "pattern": f"^{CLIENT_REQUEST_ID.pattern}$"},
    }
    for operations in doc.get("paths", {}).values():
        for operation in operations.values():
            for response in operation.get("responses", {}).values():
                response.setdefault("headers", {})["X-Request-Id"] = header


def _profile_enum(doc: dict[str, Any], profiles: list[str]) -> None:
    body = doc.get("components", {}).get("schemas", {}).get("CreateTaskBody")
    if body is None:
        return
    field = body["properties"]["profile"]
    for option in field.get("anyOf", [field]):
        if option.get("type") == "string":
            option["enum"] = profiles


def _string_choices(field: dict[str, Any], values: list[str]) -> None:
    """A nullable string field takes only ``values`` (only null when there are none)."""
    options = field.get("anyOf", [field])
    if values:
        for option in options:
            if option.get("type") == "string":
                option["enum"] = values
    elif "anyOf" in field:
        field["anyOf"] = [o for o in options if o.get("type") != "string"]


def _routing_enums(doc: dict[str, Any], settings: Settings) -> None:
    """Harnesses, models and skills a create may name: those the operator configured."""
    schemas = doc.get("components", {}).get("schemas", {})
    body = schemas.get("CreateTaskBody")
    if body is not None:
        props = body["properties"]
        harnesses: list[str] = sorted({str(p.harness) for p in settings.workers.values() if p.harness})
        models = sorted({p.harness_model for p in settings.workers.values() if p.harness_model})
        _string_choices(props["harness"], harnesses)
        _string_choices(props["harnessModel"], models)
        if not settings.skills and "skill" in props:
            props["skill"] = {"type": "null", "description": "no skill is configured"}
        if not settings.targets and "target" in props:
            props["target"] = {"type": "null", "description": "no gateway-managed target is configured"}
    skill = schemas.get("SkillInvocation")
    if skill is not None and settings.skills:
        skill["properties"]["name"]["enum"] = sorted(settings.skills)
    target = schemas.get("TargetBody")
    if target is not None and settings.targets:
        target["properties"]["name"]["enum"] = sorted(settings.targets)


TASKS = "/api/v1/agents/{agentId}/sessions/{sessionId}/tasks"


def _task_links(doc: dict[str, Any]) -> None:
    paths = doc.get("paths", {})
    created = paths.get(TASKS, {}).get("post", {}).get("responses", {}).get("201")
    if created is None:
        return
    links: dict[str, Any] = {}
    for path, operations in paths.items():
        # Only operations a created task fully names (a question id comes from elsewhere).
        if not path.startswith(TASKS + "/{taskId}") or path.count("{") > 3:
            continue
        for operation in operations.values():
            links[operation["operationId"]] = {
                "operationId": operation["operationId"],
                "parameters": {
                    "agentId": "$request.path.agentId",
                    "sessionId": "$request.path.sessionId",
                    "taskId": "$response.body#/task/taskId",
                },
            }
    created["links"] = links
