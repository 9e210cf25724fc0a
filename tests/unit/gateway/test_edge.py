"""The HTTP edge in-process: request ids, body bounds, error shapes."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import httpx
import pytest

from tests.unit.gateway.conftest import Gateway

TASKS = "/api/v1/agents/agent-1/sessions/cli-1/tasks"


def assert_error(response: httpx.Response, status: int, error: str) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error", "message"} and body["error"] == error and body["message"], body


# --- request ids -----------------------------------------------------------------------------


@pytest.mark.parametrize("offered", ["abc-123", "A.b_c:d-9", "x" * 64])
async def test_a_well_formed_client_request_id_is_used(gateway: Gateway, offered: str) -> None:
    response = await gateway.client.get("/healthz", headers={"X-Request-Id": offered})
    assert response.status_code == 200 and response.headers["x-request-id"] == offered


@pytest.mark.parametrize("offered", ["", "x" * 65, "has space", "semi;colon", "ünïcode", "a/b", "\t"])
async def test_any_other_client_request_id_is_replaced(gateway: Gateway, offered: str) -> None:
    response = await gateway.client.get("/healthz", headers={b"X-Request-Id": offered.encode()})
    assert response.status_code == 200
    assert re.fullmatch(r"[0-9a-f]{32}", response.headers["x-request-id"])


async def test_error_answers_carry_the_request_id_too(gateway: Gateway) -> None:
    response = await gateway.client.get("/nowhere", headers={"X-Request-Id": "req-1"})
    assert_error(response, 404, "NOT_FOUND")
    assert response.headers["x-request-id"] == "req-1"


# --- body bound (4096 bytes here) -------------------------------------------------------------


async def _chunks(total: int, size: int = 1000) -> AsyncIterator[bytes]:
    sent = 0
    while sent < total:
        chunk = b"x" * min(size, total - sent)
        sent += len(chunk)
        yield chunk


async def test_a_chunked_body_over_the_bound_is_413(gateway: Gateway) -> None:
    response = await gateway.client.post(
        TASKS, content=_chunks(10_000), headers={"Content-Type": "application/json", "X-Request-Id": "big-1"}
    )
    assert "content-length" not in response.request.headers
    assert_error(response, 413, "PAYLOAD_TOO_LARGE")
    assert response.headers["x-request-id"] == "big-1"


async def test_a_declared_body_over_the_bound_is_413_json(gateway: Gateway) -> None:
    # Starlette answers this one itself, in plain text; the edge gives it the JSON shape.
    response = await gateway.client.post(TASKS, content=b"x" * 5000, headers={"Content-Type": "application/json"})
    assert_error(response, 413, "PAYLOAD_TOO_LARGE")
    assert "4096" in response.json()["message"]


async def test_a_body_within_the_bound_reaches_validation(gateway: Gateway) -> None:
    response = await gateway.client.post(TASKS, content=_chunks(3000), headers={"Content-Type": "application/json"})
    # Read whole and parsed (FastAPI parses the body before the key check): not JSON.
    assert_error(response, 400, "INVALID_JSON")


# --- error shapes -----------------------------------------------------------------------------


async def test_405_lists_every_method_of_the_resource(gateway: Gateway) -> None:
    response = await gateway.client.request("TRACE", TASKS)
    assert_error(response, 405, "METHOD_NOT_ALLOWED")
    assert sorted(m.strip() for m in response.headers["allow"].split(",")) == ["GET", "HEAD", "POST"]
    response = await gateway.client.delete("/healthz")
    assert_error(response, 405, "METHOD_NOT_ALLOWED")
    assert sorted(m.strip() for m in response.headers["allow"].split(",")) == ["GET", "HEAD"]


async def test_401_and_bad_ids_are_json(gateway: Gateway) -> None:
    assert_error(await gateway.client.get(TASKS), 401, "UNAUTHENTICATED")
    response = await gateway.client.get(TASKS, headers={"Authorization": "Basic abc"})
    assert_error(response, 401, "UNAUTHENTICATED")
    assert response.headers["www-authenticate"] == "Bearer"


async def test_an_unexpected_exception_is_a_json_500(gateway: Gateway) -> None:
    async def boom() -> None:
        raise RuntimeError("secret detail")

    gateway.app.add_api_route("/boom", boom)
    response = await httpx.AsyncClient(
        transport=httpx.ASGITransport(app=gateway.app, raise_app_exceptions=False), base_url="http://gateway"
    ).get("/boom")
    assert_error(response, 500, "INTERNAL")
    assert "secret" not in response.text
