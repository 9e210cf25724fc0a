"""A local stand-in for the Telegram Bot API, for tests: records every call, serves
queued updates to getUpdates (long polling), keeps sent messages so edits of a deleted
one fail as Telegram's do, and can answer 429 with retry_after."""

from __future__ import annotations

import json
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs

from tests.support.procs import free_port

# Form fields PTB encodes as JSON (strings it sends raw).
JSON_FIELDS = {
    "chat_id",
    "message_id",
    "offset",
    "timeout",
    "limit",
    "allowed_updates",
    "reply_markup",
    "message_thread_id",
}


@dataclass
class Call:
    method: str
    params: dict[str, Any]
    at: float
    status: int


@dataclass
class BotApi:
    token: str
    port: int = 0
    calls: list[Call] = field(default_factory=list)
    # method -> retry_after seconds to answer with 429, in order, before serving it.
    throttle: dict[str, list[int]] = field(default_factory=dict)
    messages: dict[tuple[int, int], str] = field(default_factory=dict)
    _updates: list[dict[str, Any]] = field(default_factory=list)
    _next_update: int = 1
    _next_message: int = 100
    cond: threading.Condition = field(default_factory=threading.Condition)
    server: ThreadingHTTPServer | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # --- what a test does ------------------------------------------------------------

    def push(self, update: dict[str, Any]) -> None:
        with self.cond:
            self._updates.append({"update_id": self._next_update, **update})
            self._next_update += 1
            self.cond.notify_all()

    def user_message(self, chat_id: int, user_id: int, text: str, chat_type: str = "private") -> None:
        self.push(
            {
                "message": {
                    "message_id": 1,
                    "date": int(time.time()),
                    "chat": {"id": chat_id, "type": chat_type},
                    "from": {"id": user_id, "is_bot": False, "first_name": "u"},
                    "text": text,
                }
            }
        )

    def press(self, chat_id: int, user_id: int, message_id: int, data: str) -> None:
        self.push(
            {
                "callback_query": {
                    "id": f"cb{self._next_update}",
                    "from": {"id": user_id, "is_bot": False, "first_name": "u"},
                    "chat_instance": "x",
                    "data": data,
                    "message": {
                        "message_id": message_id,
                        "date": int(time.time()),
                        "chat": {"id": chat_id, "type": "private"},
                        "text": "menu",
                    },
                }
            }
        )

    def delete(self, chat_id: int, message_id: int) -> None:
        """The person deleted the message."""
        with self.cond:
            self.messages.pop((chat_id, message_id), None)

    def of(self, method: str, ok_only: bool = True) -> list[Call]:
        with self.cond:
            return [c for c in self.calls if c.method == method and (c.status == 200 or not ok_only)]

    def wait(self, predicate: Any, timeout_s: float = 15.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"bot api: condition not met; calls: {[c.method for c in self.calls]}")
            time.sleep(0.02)

    # --- serving ---------------------------------------------------------------------

    def _answer(self, method: str, p: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        with self.cond:
            waits = self.throttle.get(method)
            if waits:
                retry = waits.pop(0)
                return 429, {
                    "ok": False,
                    "error_code": 429,
                    "description": f"Too Many Requests: retry after {retry}",
                    "parameters": {"retry_after": retry},
                }
        if method == "getMe":
            return 200, {"ok": True, "result": {"id": 1, "is_bot": True, "first_name": "tg", "username": "tg_bot"}}
        if method == "getUpdates":
            offset = int(p.get("offset") or 0)
            deadline = time.monotonic() + float(p.get("timeout") or 0)
            with self.cond:
                while True:
                    ready = [u for u in self._updates if u["update_id"] >= offset]
                    left = deadline - time.monotonic()
                    if ready or left <= 0:
                        return 200, {"ok": True, "result": ready}
                    self.cond.wait(min(left, 0.2))
        if method in ("sendMessage", "editMessageText"):
            chat = int(p["chat_id"])
            with self.cond:
                if method == "sendMessage":
                    message_id = self._next_message
                    self._next_message += 1
                else:
                    message_id = int(p["message_id"])
                    current = self.messages.get((chat, message_id))
                    if current is None:
                        return 400, {
                            "ok": False,
                            "error_code": 400,
                            "description": "Bad Request: message to edit not found",
                        }
                    if current == p["text"]:
                        return 400, {
                            "ok": False,
                            "error_code": 400,
                            "description": "Bad Request: message is not modified",
                        }
                self.messages[(chat, message_id)] = p["text"]
            return 200, {
                "ok": True,
                "result": {
                    "message_id": message_id,
                    "date": int(time.time()),
                    "chat": {"id": chat, "type": "private"},
                    "text": p["text"],
                },
            }
        if method == "deleteMessage":
            with self.cond:
                self.messages.pop((int(p["chat_id"]), int(p["message_id"])), None)
            return 200, {"ok": True, "result": True}
        if method in ("answerCallbackQuery", "editMessageReplyMarkup"):
            return 200, {"ok": True, "result": True}
        return 404, {"ok": False, "error_code": 404, "description": "Not Found"}


class _BotApiServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hung up before its answer (a long poll given up when the notifier
        stops) is no error of the stand-in's; anything else is printed as usual."""
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


def start_bot_api(token: str = "123:test-token") -> BotApi:
    api = BotApi(token=token, port=free_port())

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            raw = self.rfile.read(int(self.headers.get("content-length", "0"))).decode()
            prefix = f"/bot{api.token}/"
            if not self.path.startswith(prefix):
                self._reply(401, {"ok": False, "error_code": 401, "description": "Unauthorized"})
                return
            method = self.path[len(prefix) :]
            if self.headers.get("content-type", "").startswith("application/json"):
                params = json.loads(raw or "{}")
            else:
                params = {k: (json.loads(v[0]) if k in JSON_FIELDS else v[0]) for k, v in parse_qs(raw).items()}
            status, doc = api._answer(method, params)
            with api.cond:
                api.calls.append(Call(method, params, time.monotonic(), status))
            self._reply(status, doc)

        def _reply(self, status: int, doc: dict[str, Any]) -> None:
            body = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    api.server = _BotApiServer(("127.0.0.1", api.port), Handler)
    threading.Thread(target=api.server.serve_forever, daemon=True).start()
    return api
