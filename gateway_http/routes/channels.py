"""Where the notifier delivers a chat channel's notifications (its signed webhook
contract) to the adapter that speaks the chat's API. Internal: not in /openapi.json."""

from __future__ import annotations

import hashlib
import hmac
import json

from fastapi import APIRouter, Request, Response

from gateway_http.errors import ApiError
from gateway_http.telegram import TelegramAdapter

router = APIRouter(include_in_schema=False)


@router.post("/internal/channels/{name}/deliveries")
async def deliver(request: Request, name: str) -> Response:
    adapters: dict[str, TelegramAdapter] = request.app.state.telegram
    adapter = adapters.get(name)
    if adapter is None:
        raise ApiError(404, "NOT_FOUND", "no chat adapter for that channel")
    body = await request.body()
    expected = "sha256=" + hmac.new(adapter.channel.secret.encode(), body, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(request.headers.get("x-taskgate-signature", ""), expected):
        raise ApiError(401, "UNAUTHENTICATED", "bad or missing X-Taskgate-Signature")
    try:
        doc = json.loads(body)
        str(doc["agentId"]), str(doc["sessionId"]), str(doc["text"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ApiError(400, "INVALID_JSON", "not a notification") from exc
    status, retry_after = await adapter.deliver(doc)
    headers = {"Retry-After": str(max(1, round(retry_after)))} if retry_after is not None else {}
    return Response(status_code=status, headers=headers)
