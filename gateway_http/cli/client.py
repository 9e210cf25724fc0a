"""A small REST client for the CLI."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx


class ApiFailure(Exception):
    def __init__(self, status: int, error: str, message: str) -> None:
        super().__init__(f"{status} {error}: {message}")
        self.status = status
        self.error = error


class RestClient:
    def __init__(self, base_url: str, api_key: str, agent: str, session: str, timeout_s: float = 30.0) -> None:
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"), timeout=timeout_s, headers={"Authorization": f"Bearer {api_key}"}
        )
        self._prefix = f"/api/v1/agents/{agent}/sessions/{session}"

    def _call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        try:
            response = self._http.request(method, self._prefix + path, **kwargs)
        except httpx.HTTPError as exc:
            raise ApiFailure(0, "UNREACHABLE", f"cannot reach {self._http.base_url}: {exc}") from exc
        try:
            body = response.json()
        except ValueError:
            body = {"error": "HTTP_ERROR", "message": response.text[:200]}
        if response.status_code >= 400:
            raise ApiFailure(response.status_code, body.get("error", "ERROR"), body.get("message", ""))
        return body  # type: ignore[no-any-return]

    def list_tasks(self, page: int, page_size: int, include_all: bool) -> dict[str, Any]:
        params = {"page": page, "page_size": page_size, "all": str(include_all).lower()}
        return self._call("GET", "/tasks", params=params)

    def get_task(self, task_id: str) -> dict[str, Any]:
        return self._call("GET", f"/tasks/{task_id}")["task"]  # type: ignore[no-any-return]

    def create_task(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._call("POST", "/tasks", json=body)["task"]  # type: ignore[no-any-return]

    def cancel_task(self, task_id: str, replaced_by: str | None) -> dict[str, Any]:
        body = {"replacedByTaskId": replaced_by} if replaced_by else {}
        return self._call("POST", f"/tasks/{task_id}/cancel", json=body)["task"]  # type: ignore[no-any-return]

    def retry_cleanup(self, task_id: str) -> dict[str, Any]:
        return self._call("POST", f"/tasks/{task_id}/retry-cleanup")["task"]  # type: ignore[no-any-return]

    def answer(self, task_id: str, question_id: str, answer: str) -> dict[str, Any]:
        body = {"questionId": question_id, "answer": answer}
        return self._call("POST", f"/tasks/{task_id}/answer", json=body)["task"]  # type: ignore[no-any-return]

    def list_messages(self, page: int, page_size: int) -> dict[str, Any]:
        return self._call("GET", "/messages", params={"page": page, "page_size": page_size})

    def list_notifications(self, page: int, page_size: int, state: str | None) -> dict[str, Any]:
        params: dict[str, Any] = {"page": page, "page_size": page_size}
        if state:
            params["state"] = state
        return self._call("GET", "/notifications", params=params)

    def activity(self, last_event_id: str | None = None) -> Iterator[tuple[str, str | None, dict[str, Any]]]:
        """(event, id, data) for each frame of the activity stream until it ends; heartbeats skipped."""
        headers = {"Accept": "text/event-stream"}
        if last_event_id:
            headers["Last-Event-ID"] = last_event_id
        timeout = httpx.Timeout(30.0, read=None)
        try:
            with self._http.stream("GET", self._prefix + "/activity/stream", headers=headers, timeout=timeout) as r:
                if r.status_code >= 400:
                    r.read()
                    body = r.json() if r.headers.get("content-type", "").startswith("application/json") else {}
                    raise ApiFailure(r.status_code, body.get("error", "ERROR"), body.get("message", ""))
                fields: dict[str, str] = {}
                for line in r.iter_lines():
                    if line.startswith(":"):
                        continue
                    if line == "":
                        if "data" in fields:
                            yield fields.get("event", "message"), fields.get("id"), json.loads(fields["data"])
                        fields = {}
                        continue
                    name, _, value = line.partition(":")
                    fields[name] = value.removeprefix(" ")
        except httpx.HTTPError as exc:
            raise ApiFailure(0, "UNREACHABLE", f"cannot reach {self._http.base_url}: {exc}") from exc

    def close(self) -> None:
        self._http.close()
