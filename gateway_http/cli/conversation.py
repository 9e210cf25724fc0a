"""``taskgate messages list``, ``taskgate activity watch``, ``taskgate notifications list``."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any, TextIO

from gateway_http.cli.client import ApiFailure, RestClient
from gateway_http.cli.tables import render_table

ClientFactory = Callable[[argparse.Namespace], RestClient]
RECONNECT_S = 1.0


def _short(iso: str | None) -> str:
    return iso[11:19] if iso else ""


def cmd_messages_list(args: argparse.Namespace, out: TextIO, client: RestClient) -> int:
    body = client.list_messages(args.page, args.page_size)
    rows = [
        [_short(m.get("completedAt") or m.get("createdAt")), m["role"], m.get("responseId", ""), m["text"]]
        for m in body["messages"]
    ]
    print(render_table(["at", "role", "response id", "text"], rows, max_width=60), file=out)
    print(f"page {body['page'] + 1} of {body['pages']} · {body['total']} message(s)", file=out)
    return 0


def cmd_notifications_list(args: argparse.Namespace, out: TextIO, client: RestClient) -> int:
    body = client.list_notifications(args.page, args.page_size, args.state)
    rows = [
        [
            n["notificationId"],
            n["kind"],
            n["state"],
            len(n.get("attempts", [])),
            _short(n.get("nextAttemptAt")),
            n["text"],
        ]
        for n in body["notifications"]
    ]
    headers = ["notification id", "kind", "state", "attempts", "next attempt", "text"]
    print(render_table(headers, rows, max_width=48), file=out)
    print(f"page {body['page'] + 1} of {body['pages']} · {body['total']} notification(s)", file=out)
    return 0


def _snapshot_line(data: dict[str, Any]) -> str:
    status = "final" if data.get("final") else "…"
    return f"[{data.get('responseId')} {status}] {data.get('text', '')}"


def cmd_activity_watch(
    args: argparse.Namespace, out: TextIO, client: RestClient, sleep: Callable[[float], None] = time.sleep
) -> int:
    """Print each snapshot as it replaces the previous one; reconnect with Last-Event-ID; Ctrl+C stops."""
    last_id: str | None = None
    try:
        while True:
            try:
                for event, frame_id, data in client.activity(last_id):
                    last_id = frame_id or last_id
                    if event == "notification":
                        print(f"[notification {data.get('kind')}] {data.get('text', '')}", file=out, flush=True)
                    elif event == "error":
                        print(f"taskgate: stream ended: {data.get('error')}: {data.get('message')}", file=out)
                        if data.get("error") in ("UNAUTHENTICATED", "NOT_A_MEMBER"):
                            return 2
                    else:
                        print(_snapshot_line(data), file=out, flush=True)
            except ApiFailure as exc:
                if exc.status in (400, 401, 403, 404, 409) or args.once:
                    raise
            if args.once:
                return 0
            sleep(RECONNECT_S)
    except KeyboardInterrupt:
        return 0


def register(top: Any, make_client: ClientFactory) -> None:
    """Adds the conversation commands to the top-level parser's subcommands."""

    def with_client(fn: Callable[..., int]) -> Callable[[argparse.Namespace, TextIO], int]:
        def run(args: argparse.Namespace, out: TextIO) -> int:
            client = make_client(args)
            try:
                return fn(args, out, client)
            finally:
                client.close()

        return run

    def rest_group(name: str, help_text: str) -> Any:
        group = top.add_parser(name, help=help_text)
        group.add_argument("--url", help="gateway URL (TASKGATE_URL, default http://127.0.0.1:8080)")
        group.add_argument("--api-key", help="API key (TASKGATE_API_KEY)")
        group.add_argument("--agent", help="agent id (TASKGATE_AGENT)")
        group.add_argument("--session", help="session id (TASKGATE_SESSION)")
        return group.add_subparsers(dest="action", required=True)

    msub = rest_group("messages", "the session's conversation history")
    mlist = msub.add_parser("list", help="messages, assistant responses by completion time")
    mlist.add_argument("--page", type=int, default=0)
    mlist.add_argument("--page-size", type=int, default=10)
    mlist.set_defaults(fn=with_client(cmd_messages_list))

    asub = rest_group("activity", "the live activity stream")
    watch = asub.add_parser("watch", help="print response snapshots as they replace each other; Ctrl+C stops")
    watch.add_argument("--once", action="store_true", help=argparse.SUPPRESS)
    watch.set_defaults(fn=with_client(cmd_activity_watch))

    nsub = rest_group("notifications", "task reports and questions, with their delivery attempts")
    nlist = nsub.add_parser("list", help="notifications of the session")
    nlist.add_argument("--state", choices=["pending", "delivered", "stopped"])
    nlist.add_argument("--page", type=int, default=0)
    nlist.add_argument("--page-size", type=int, default=10)
    nlist.set_defaults(fn=with_client(cmd_notifications_list))
