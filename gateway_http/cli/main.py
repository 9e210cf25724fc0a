"""The ``taskgate`` command.

``taskgate admin ...`` works on the gateway's local database (operator only), except
``admin hosts``, which asks a scheduler over gRPC as the operator;
``taskgate tasks ...`` talks to the REST API (TASKGATE_URL, TASKGATE_API_KEY).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, TextIO

from gateway_http import safemode
from gateway_http.chat import CHAT_ID_REGEX
from gateway_http.cli import conversation, databases, hosts, pending
from gateway_http.cli.client import ApiFailure, RestClient
from gateway_http.cli.tables import render_table
from gateway_http.store import MIGRATIONS, GatewayStore
from libs.db import Database
from libs.grpc_client import ClientSecurity
from libs.ids import ID_PATTERN
from libs.internal_auth import IDENTITIES, SecretsMissing, ensure_secrets, secret_file
from libs.settings import Settings, SettingsError, load_settings

TERMINAL = {"completed", "failed", "cancelled"}
WATCH_INTERVAL_S = 3.0


class CliError(Exception):
    pass


def _id(kind: str) -> Callable[[str], str]:
    def parse(value: str) -> str:
        if not ID_PATTERN.match(value):
            raise argparse.ArgumentTypeError(
                f"{kind} must be 1-128 characters of letters, digits, '.', '_', ':' or '-'"
            )
        return value

    return parse


def _chat_id(kind: str) -> Callable[[str], str]:
    def parse(value: str) -> str:
        if not re.match(CHAT_ID_REGEX, value):
            raise argparse.ArgumentTypeError(f"{kind} must be an id word, or a number that may be negative")
        return value

    return parse


# --- admin (local database) -------------------------------------------------


def _admin_db() -> Database:
    settings = _settings()
    db = Database(settings.db_url("gateway"), MIGRATIONS)
    db.migrate()
    return db


def _in_transaction(fn: Callable[[Any], Any]) -> Any:
    db = _admin_db()
    try:
        with db.session() as session, session.begin():
            return fn(session)
    finally:
        db.close()


def cmd_keys_create(args: argparse.Namespace, out: TextIO) -> int:
    tools = args.allow_tool if args.allow_tool else None
    key, secret = _in_transaction(lambda s: GatewayStore.create_key(s, args.principal, args.agent, tools))
    print(f"key id:    {key.key_id}", file=out)
    print(f"principal: {key.principal}", file=out)
    print(f"agents:    {', '.join(key.agents)}", file=out)
    print("Store the key now; only its hash is kept:", file=out)
    print(secret, file=out)
    return 0


def cmd_keys_list(args: argparse.Namespace, out: TextIO) -> int:
    keys = _in_transaction(GatewayStore.list_keys)
    rows = [
        [
            k.key_id,
            k.display_prefix + "…",
            k.principal,
            ",".join(k.agents),
            "all" if k.allow_tools is None else ",".join(k.allow_tools),
            _when_ms(k.created_at),
            "revoked" if k.revoked_at else "active",
        ]
        for k in keys
    ]
    print(render_table(["key id", "prefix", "principal", "agents", "tools", "created", "status"], rows), file=out)
    return 0


def cmd_keys_revoke(args: argparse.Namespace, out: TextIO) -> int:
    if not _in_transaction(lambda s: GatewayStore.revoke_key(s, args.key_id)):
        raise CliError(f"no active key {args.key_id}")
    print(f"revoked {args.key_id}", file=out)
    return 0


def cmd_members_add(args: argparse.Namespace, out: TextIO) -> int:
    """One principal into one or more sessions of an agent, in one transaction."""
    sessions = list(dict.fromkeys(args.session))  # a session named twice is added once
    added = _in_transaction(
        lambda s: [GatewayStore.add_member(s, args.agent, session, args.principal) for session in sessions]
    )
    for session, new in zip(sessions, added, strict=True):
        print(("added" if new else "already a member:") + f" {args.principal} → {args.agent}/{session}", file=out)
    return 0


def cmd_members_remove(args: argparse.Namespace, out: TextIO) -> int:
    if not _in_transaction(lambda s: GatewayStore.remove_member(s, args.agent, args.session, args.principal)):
        raise CliError("no such membership")
    print(f"removed {args.principal} from {args.agent}/{args.session}", file=out)
    return 0


def cmd_members_list(args: argparse.Namespace, out: TextIO) -> int:
    rows = _in_transaction(
        lambda s: [
            [m.agent_id, m.session_id, m.principal, _when_ms(m.created_at)]
            for m in GatewayStore.list_members(s, args.agent)
        ]
    )
    print(render_table(["agent", "session", "principal", "added"], rows), file=out)
    return 0


def _safemode_target(name: str) -> str:
    target = _settings().targets.get(name)
    if target is None:
        raise CliError(f"no [targets.{name}] in the configuration")
    if not target.safemode:
        print(f"note: target {name} is not in safemode; grants and assignments do not restrict it", file=sys.stderr)
    return name


def cmd_safemode_change(args: argparse.Namespace, out: TextIO) -> int:
    target = _safemode_target(args.target)
    action = args.action
    if action == "grant":
        _in_transaction(lambda s: safemode.grant(s, args.agent, target, args.ttl_s))
        changed = True
    else:
        change = {"revoke": safemode.revoke, "assign": safemode.assign, "unassign": safemode.unassign}[action]
        changed = _in_transaction(lambda s: change(s, args.agent, target))
    done = {"grant": "granted", "revoke": "revoked", "assign": "assigned", "unassign": "unassigned"}[action]
    print(f"{done}: {target} for {args.agent}" if changed else f"unchanged: {target} for {args.agent}", file=out)
    return 0


def cmd_safemode_list(args: argparse.Namespace, out: TextIO) -> int:
    rows = _in_transaction(
        lambda s: [[e.agent_id, e.target, e.granted, "yes" if e.assigned else "no"] for e in safemode.entries(s)]
    )
    print(render_table(["agent", "target", "grant", "assigned"], rows), file=out)
    return 0


def cmd_channels_bind(args: argparse.Namespace, out: TextIO) -> int:
    thread = args.thread or ""
    changed = _in_transaction(
        lambda s: GatewayStore.bind_channel(s, args.agent, args.session, args.channel, args.chat, thread)
    )
    where = f"{args.channel} chat {args.chat}" + (f" thread {thread}" if thread else "")
    print(("bound" if changed else "already bound:") + f" {where} → {args.agent}/{args.session}", file=out)
    return 0


def cmd_channels_unbind(args: argparse.Namespace, out: TextIO) -> int:
    if not _in_transaction(lambda s: GatewayStore.unbind_channel(s, args.channel, args.chat, args.thread or "")):
        raise CliError("no such binding")
    print(f"unbound {args.channel} chat {args.chat}", file=out)
    return 0


def cmd_channels_list(args: argparse.Namespace, out: TextIO) -> int:
    rows = _in_transaction(
        lambda s: [
            [b.channel, b.chat_id, b.thread_id, b.agent_id, b.session_id, _when_ms(b.created_at)]
            for b in GatewayStore.list_bindings(s)
        ]
    )
    print(render_table(["channel", "chat", "thread", "agent", "session", "bound"], rows), file=out)
    return 0


# --- tasks (REST) -------------------------------------------------------------


def _when_ms(ms: int | None) -> str:
    return datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M") if ms else ""


def _short_time(iso: str | None) -> str:
    return iso[11:19] if iso else ""


def _elapsed(task: dict[str, Any]) -> str:
    ms = task.get("timing", {}).get("elapsedMs", 0)
    seconds = ms // 1000
    return f"{seconds // 3600}h{seconds // 60 % 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


def _client(args: argparse.Namespace) -> RestClient:
    key = args.api_key or os.environ.get("TASKGATE_API_KEY", "")
    agent = args.agent or os.environ.get("TASKGATE_AGENT", "")
    session = args.session or os.environ.get("TASKGATE_SESSION", "")
    missing = [
        name
        for name, value in (("--api-key/TASKGATE_API_KEY", key), ("--agent", agent), ("--session", session))
        if not value
    ]
    if missing:
        raise CliError("missing " + ", ".join(missing))
    return RestClient(args.url or os.environ.get("TASKGATE_URL", "http://127.0.0.1:8080"), key, agent, session)


def _task_rows(tasks: list[dict[str, Any]]) -> list[list[object]]:
    return [
        [
            t["taskId"],
            t["state"],
            t["title"],
            (t.get("progress") or {}).get("text", ""),
            _elapsed(t),
            _short_time(t.get("updatedAt")),
        ]
        for t in tasks
    ]


TASK_HEADERS = ["task id", "state", "title", "progress", "elapsed", "updated"]


def cmd_tasks_list(args: argparse.Namespace, out: TextIO) -> int:
    client = _client(args)
    body = client.list_tasks(args.page, args.page_size, args.all)
    print(render_table(TASK_HEADERS, _task_rows(body["tasks"]), max_width=48), file=out)
    print(f"page {body['page'] + 1} of {body['pages']} · {body['total']} task(s)", file=out)
    return 0


def _show_lines(task: dict[str, Any]) -> list[str]:
    lines = [
        f"{task['title']}  [{task['state']}]",
        f"  task id:   {task['taskId']}",
        f"  profile:   {task.get('targetProfile', '')}",
        f"  elapsed:   {_elapsed(task)}",
    ]
    if task.get("progress"):
        lines.append(f"  progress:  {task['progress']['text']}  (at {_short_time(task['progress']['updatedAt'])})")
    last_tool = (task.get("activity") or {}).get("lastTool")
    if last_tool:
        code = f" exit {last_tool['exitCode']}" if "exitCode" in last_tool else ""
        lines.append(f"  last tool: {last_tool['name']} {last_tool['status']}{code}")
    for key in ("inspection", "pendingQuestion", "cancellation", "failure"):
        if task.get(key):
            lines.append(f"  {key}: {json.dumps(task[key])}")
    if task.get("result"):
        lines.append(f"  result:    {task['result']['text']}")
    lines.append(f"  workspace: {task['workspace']['path']}")
    if task.get("attempts"):
        lines.append(f"  attempts:  {len(task['attempts'])}")
    return lines


def cmd_tasks_show(args: argparse.Namespace, out: TextIO) -> int:
    task = _client(args).get_task(args.task_id)
    if args.json:
        print(json.dumps(task, indent=2), file=out)
    else:
        print("\n".join(_show_lines(task)), file=out)
    return 0


def _watch_line(task: dict[str, Any]) -> str:
    """What ``watch`` shows of a task; a poll prints only when this changes."""
    line = f"{task['state']:<20} {(task.get('progress') or {}).get('text', '')}"
    last_tool = (task.get("activity") or {}).get("lastTool")
    if last_tool:
        line += f"  [{last_tool['name']} {last_tool['status']}]"
    if task.get("pendingQuestion"):
        line += f"  question {task['pendingQuestion']['questionId']}: {task['pendingQuestion']['text']}"
    if task.get("inspection"):
        line += f"  inspection: {task['inspection']['reason']}"
    return line


def cmd_tasks_watch(args: argparse.Namespace, out: TextIO, sleep: Callable[[float], None] = time.sleep) -> int:
    client = _client(args)
    previous: str | None = None
    try:
        while True:
            if args.task_id:
                task = client.get_task(args.task_id)
                line = _watch_line(task)
                if line != previous:
                    print(f"[{datetime.now().strftime('%H:%M:%S')}] {line}", file=out, flush=True)
                    previous = line
                if task["state"] in TERMINAL:
                    if task.get("failure"):
                        print(f"  failure: {task['failure']['code']}: {task['failure']['message']}", file=out)
                    return 0 if task["state"] == "completed" else 1
            else:
                body = client.list_tasks(args.page, 10, args.all)
                rendered = render_table(TASK_HEADERS, _task_rows(body["tasks"]), max_width=48)
                digest = json.dumps([_watch_line(t) for t in body["tasks"]])
                if digest != previous:
                    print(f"[{datetime.now().strftime('%H:%M:%S')}]\n{rendered}", file=out, flush=True)
                    previous = digest
            sleep(args.interval)
    except KeyboardInterrupt:
        print("stopped watching; the task keeps running", file=out)
        return 130


def cmd_tasks_cancel(args: argparse.Namespace, out: TextIO) -> int:
    task = _client(args).cancel_task(args.task_id, args.replaced_by)
    print(f"{task['taskId']}: {task['state']}", file=out)
    return 0


def cmd_tasks_retry_cleanup(args: argparse.Namespace, out: TextIO) -> int:
    task = _client(args).retry_cleanup(args.task_id)
    print(f"{task['taskId']}: {task['state']}", file=out)
    return 0


def cmd_tasks_create(args: argparse.Namespace, out: TextIO) -> int:
    body: dict[str, Any] = {"title": args.title, "instructions": args.instructions}
    if args.profile:
        body["profile"] = args.profile
    task = _client(args).create_task(body)
    print(f"{task['taskId']}: {task['state']}", file=out)
    return 0


def cmd_tasks_answer(args: argparse.Namespace, out: TextIO) -> int:
    task = _client(args).answer(args.task_id, args.question, args.answer)
    question = task.get("pendingQuestion")
    waiting = f" (still waiting for the worker to take it: question {question['questionId']})" if question else ""
    print(f"{task['taskId']}: answer saved; task is {task['state']}{waiting}", file=out)
    return 0


def _settings() -> Settings:
    try:
        return load_settings(os.environ)
    except SettingsError as exc:
        raise CliError(str(exc)) from exc


def cmd_pending_listen(args: argparse.Namespace, out: TextIO) -> int:
    try:
        security = ClientSecurity.for_identity(_settings(), "frontend")
    except SecretsMissing as exc:
        raise CliError(str(exc)) from exc
    return pending.listen(args.prefix, args.addr, security, out, input)


def cmd_secrets_init(args: argparse.Namespace, out: TextIO) -> int:
    settings = _settings()
    created = ensure_secrets(settings.secrets_path)
    rows = [
        [identity, "created" if identity in created else "kept", str(secret_file(settings.secrets_path, identity))]
        for identity in IDENTITIES
    ]
    print(render_table(["identity", "secret", "file (0600)"], rows), file=out)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="taskgate", description="taskgate operator and task CLI")
    top = parser.add_subparsers(dest="group", required=True)

    admin = top.add_parser("admin", help="operator commands on the local gateway database")
    admin_sub = admin.add_subparsers(dest="what", required=True)
    keys = admin_sub.add_parser("keys", help="API keys").add_subparsers(dest="action", required=True)
    create = keys.add_parser("create", help="create a key; prints it as the last line")
    create.add_argument("--principal", required=True, type=_id("principal"))
    create.add_argument(
        "--agent",
        required=True,
        action="append",
        type=_id("agent"),
        help="agent the key may act for (repeat for several)",
    )
    create.add_argument("--allow-tool", action="append", help="restrict the key to these tools (repeatable)")
    create.set_defaults(fn=cmd_keys_create)
    keys.add_parser("list", help="list keys").set_defaults(fn=cmd_keys_list)
    revoke = keys.add_parser("revoke", help="revoke a key by id")
    revoke.add_argument("key_id")
    revoke.set_defaults(fn=cmd_keys_revoke)

    members = admin_sub.add_parser("members", help="session memberships").add_subparsers(dest="action", required=True)
    for name, fn in (("add", cmd_members_add), ("remove", cmd_members_remove)):
        p = members.add_parser(name)
        p.add_argument("--agent", required=True, type=_id("agent"))
        if name == "add":
            p.add_argument("--session", required=True, action="append", type=_id("session"), help="repeat for several")
        else:
            p.add_argument("--session", required=True, type=_id("session"))
        p.add_argument("--principal", required=True, type=_id("principal"))
        p.set_defaults(fn=fn)
    secrets = admin_sub.add_parser("secrets", help="internal gRPC caller secrets").add_subparsers(
        dest="action", required=True
    )
    secrets.add_parser("init", help="create missing caller secrets (0600) under the secrets directory").set_defaults(
        fn=cmd_secrets_init
    )
    channels = admin_sub.add_parser("channels", help="chat channel bindings (chat/thread ↔ session)")
    csub = channels.add_subparsers(dest="action", required=True)
    for name, fn in (("bind", cmd_channels_bind), ("unbind", cmd_channels_unbind)):
        p = csub.add_parser(name)
        if name == "bind":
            p.add_argument("--agent", required=True, type=_id("agent"))
            p.add_argument("--session", required=True, type=_id("session"))
        p.add_argument("--channel", required=True, type=_id("channel"), help="a [channels.NAME] of the config")
        p.add_argument("--chat", required=True, type=_chat_id("chat"), help="the chat's id on that channel")
        p.add_argument("--thread", type=_chat_id("thread"), help="a thread of the chat (default: the whole chat)")
        p.set_defaults(fn=fn)
    csub.add_parser("list").set_defaults(fn=cmd_channels_list)
    mlist = members.add_parser("list")
    mlist.add_argument("--agent", type=_id("agent"))
    mlist.set_defaults(fn=cmd_members_list)

    safe = admin_sub.add_parser("safemode", help="safemode targets: grants and local assignments (operator only)")
    ssub = safe.add_subparsers(dest="action", required=True)
    for name in ("grant", "revoke", "assign", "unassign"):
        p = ssub.add_parser(name)
        p.add_argument("--agent", required=True)
        p.add_argument("--target", required=True)
        if name == "grant":
            p.add_argument("--ttl-s", type=int, default=None, help="the grant expires after this many seconds")
        p.set_defaults(fn=cmd_safemode_change)
    ssub.add_parser("list").set_defaults(fn=cmd_safemode_list)
    hosts.register(admin_sub, _settings)
    databases.register(admin_sub, _settings)

    tasks = top.add_parser("tasks", help="tasks over the REST API")
    tasks.add_argument("--url", help="gateway URL (TASKGATE_URL, default http://127.0.0.1:8080)")
    tasks.add_argument("--api-key", help="API key (TASKGATE_API_KEY)")
    tasks.add_argument("--agent", help="agent id (TASKGATE_AGENT)")
    tasks.add_argument("--session", help="session id (TASKGATE_SESSION)")
    tsub = tasks.add_subparsers(dest="action", required=True)
    tlist = tsub.add_parser("list", help="list tasks of the session")
    tlist.add_argument("--all", action="store_true", help="include finished tasks")
    tlist.add_argument("--page", type=int, default=0)
    tlist.add_argument("--page-size", type=int, default=10)
    tlist.set_defaults(fn=cmd_tasks_list)
    show = tsub.add_parser("show", help="show one task")
    show.add_argument("task_id")
    show.add_argument("--json", action="store_true")
    show.set_defaults(fn=cmd_tasks_show)
    watch = tsub.add_parser("watch", help="poll and print changes; Ctrl+C stops watching, never cancels")
    watch.add_argument("task_id", nargs="?")
    watch.add_argument("--all", action="store_true")
    watch.add_argument("--page", type=int, default=0)
    watch.add_argument("--interval", type=float, default=WATCH_INTERVAL_S, help=argparse.SUPPRESS)
    watch.set_defaults(fn=cmd_tasks_watch)
    cancel = tsub.add_parser("cancel", help="cancel a task")
    cancel.add_argument("task_id")
    cancel.add_argument("--replaced-by")
    cancel.set_defaults(fn=cmd_tasks_cancel)
    retry = tsub.add_parser("retry-cleanup", help="try again to prove a cancelled task's processes are gone")
    retry.add_argument("task_id")
    retry.set_defaults(fn=cmd_tasks_retry_cleanup)
    answer = tsub.add_parser("answer", help="answer the task's current question")
    answer.add_argument("task_id")
    answer.add_argument("--question", required=True, help="the questionId shown in pendingQuestion")
    answer.add_argument("answer")
    answer.set_defaults(fn=cmd_tasks_answer)
    new = tsub.add_parser("create", help="create a task")
    new.add_argument("--title", required=True)
    new.add_argument("--instructions", default="")
    new.add_argument("--profile")
    new.set_defaults(fn=cmd_tasks_create)
    pend = top.add_parser("pending", help="pending asks and confirms (a front-end over gRPC)")
    psub = pend.add_subparsers(dest="action", required=True)
    plisten = psub.add_parser("listen", help="show entries as they come and answer them")
    plisten.add_argument("--prefix", default="cli-", help="session-origin prefix: cli-, chat-, tg-, dc- or ''")
    plisten.add_argument("--addr", help="pending-registry address (TASKGATE_PENDING_ADDR)")
    plisten.set_defaults(fn=cmd_pending_listen)
    conversation.register(top, _client)
    return parser


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.fn(args, out or sys.stdout))
    except (CliError, ApiFailure, hosts.HostsCliError) as exc:
        print(f"taskgate: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
