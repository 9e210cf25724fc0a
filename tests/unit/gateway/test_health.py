"""GET /healthz against real grpc.aio health servers: required backends decide, advisory ones degrade."""

from __future__ import annotations

import pytest

from tests.unit.gateway.conftest import NOT_SERVING, Gateway


async def test_health_is_ok_when_every_backend_serves(gateway: Gateway) -> None:
    response = await gateway.client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {
        "status": "ok",
        "required": {"scheduler": "SERVING", "pending": "SERVING", "notifier": "SERVING"},
        "advisory": {"telemetry": "SERVING"},
    }


async def test_an_advisory_backend_down_degrades_but_stays_200(gateway: Gateway) -> None:
    await gateway.set_health("telemetry", NOT_SERVING)
    response = await gateway.client.get("/healthz")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "degraded" and body["advisory"] == {"telemetry": "NOT_SERVING"}
    await gateway.stop_backend("telemetry")
    body = (await gateway.client.get("/healthz")).json()
    assert body["status"] == "degraded" and body["advisory"]["telemetry"].startswith("UNREACHABLE")


@pytest.mark.parametrize("name", ["scheduler", "pending", "notifier"])
async def test_a_required_backend_not_serving_is_503(gateway: Gateway, name: str) -> None:
    await gateway.set_health(name, NOT_SERVING)
    response = await gateway.client.get("/healthz")
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "unavailable" and body["required"][name] == "NOT_SERVING"
    await gateway.stop_backend(name)
    body = (await gateway.client.get("/healthz")).json()
    assert body["required"][name].startswith("UNREACHABLE")
