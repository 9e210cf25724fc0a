"""The published OpenAPI document: what FastAPI derives from the routes, plus what only settings know.

- the worker profiles a task may name (the gateway refuses others before any backend is asked);
- no 422 answers: validation errors are 400 ``{error, message}`` here (``errors.validation_error_handler``);
- error answers as JSON on streaming routes too;
- links from a created task to the operations on it, so clients and fuzzers follow real ids.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI

from libs.settings import Settings


def install(app: FastAPI, settings: Settings) -> None:
    generate: Callable[[], dict[str, Any]] = app.openapi

    def document() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = generate()
            _drop_422(doc)
            _errors_as_json(doc)
            _profile_enum(doc, sorted(settings.workers))
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


def _profile_enum(doc: dict[str, Any], profiles: list[str]) -> None:
    body = doc.get("components", {}).get("schemas", {}).get("CreateTaskBody")
    if body is None:
        return
    field = body["properties"]["profile"]
    for option in field.get("anyOf", [field]):
        if option.get("type") == "string":
            option["enum"] = profiles


TASKS = "/api/v1/agents/{agentId}/sessions/{sessionId}/tasks"


def _task_links(doc: dict[str, Any]) -> None:
    paths = doc.get("paths", {})
    created = paths.get(TASKS, {}).get("post", {}).get("responses", {}).get("201")
    if created is None:
        return
    links: dict[str, Any] = {}
    for path, operations in paths.items():
        if not path.startswith(TASKS + "/{taskId}"):
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
