"""`taskgate admin hosts ...`: the scheduler hosts sharing one database, and the operator's way
out of HOST_LOST for a host that never comes back.

Talks to a scheduler replica over gRPC as the ``operator`` caller identity (its secret from the
secrets directory or TASKGATE_SECRET_OPERATOR), at TASKGATE_SCHEDULER_ADDR unless ``--addr``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TextIO

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from gateway_http.cli.tables import render_table
from libs.grpc_client import ClientSecurity, sync_channel
from libs.internal_auth import SecretsMissing
from libs.settings import Settings
from taskgate.scheduler.v1 import scheduler_pb2 as pb
from taskgate.scheduler.v1 import scheduler_pb2_grpc as pb_grpc

RPC_TIMEOUT_S = 30.0


class HostsCliError(Exception):
    pass


def _when(stamp: Timestamp, present: bool) -> str:
    if not present:
        return "-"
    return datetime.fromtimestamp(stamp.ToMilliseconds() / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _lease(host: pb.SchedulerHost) -> str:
    if not host.HasField("lease_expire_time"):
        return "none (row gone)"
    expires = _when(host.lease_expire_time, True)
    return f"live until {expires}" if host.lease_live else f"expired {expires}"


def _host_rows(hosts: list[pb.SchedulerHost]) -> list[list[object]]:
    return [
        [
            h.host_id + (" (answering)" if h.serving else ""),
            _lease(h),
            "yes" if h.connected else "no",
            _when(h.start_time, h.HasField("start_time")),
            h.queued_tasks,
            h.active_tasks,
            h.needs_reconciliation_tasks,
            h.host_lost_tasks,
            h.resolvable_tasks,
        ]
        for h in hosts
    ]


class HostsCommands:
    def __init__(self, settings: Callable[[], Settings]) -> None:
        self.settings = settings

    def _call(self, args: argparse.Namespace, call: Callable[[pb_grpc.SchedulerServiceStub], Any]) -> Any:
        settings = self.settings()
        try:
            security = ClientSecurity.for_identity(settings, "operator")
        except SecretsMissing as exc:
            raise HostsCliError(str(exc)) from exc
        addr = args.addr or settings.scheduler_addr
        with sync_channel(addr, security) as channel:
            try:
                return call(pb_grpc.SchedulerServiceStub(channel))
            except grpc.RpcError as exc:
                raise HostsCliError(f"the scheduler at {addr} refused: {exc.code().name}: {exc.details()}") from exc

    def list(self, args: argparse.Namespace, out: TextIO) -> int:
        def every_page(stub: pb_grpc.SchedulerServiceStub) -> list[pb.SchedulerHost]:
            found: list[pb.SchedulerHost] = []
            token = ""
            while True:
                page = stub.ListHosts(pb.ListHostsRequest(page_token=token), timeout=RPC_TIMEOUT_S)
                found.extend(page.hosts)
                token = page.next_page_token
                if not token:
                    return found

        hosts: list[pb.SchedulerHost] = self._call(args, every_page)
        if not hosts:
            print("no scheduler hosts known", file=out)
            return 0
        headers = [
            "host",
            "lease",
            "connected",
            "started",
            "queued",
            "active",
            "needs recon.",
            "host lost",
            "resolvable",
        ]
        print(render_table(headers, _host_rows(hosts), max_width=80), file=out)
        return 0

    def resolve(self, args: argparse.Namespace, out: TextIO) -> int:
        if not args.host_is_gone:
            raise HostsCliError(
                f"refusing to resolve host {args.host_id} without --host-is-gone: with it you assert the host"
                " is gone for good (decommissioned, its workers with it); its tasks then run elsewhere or end"
                " without proof that its workers stopped. A host that may come back reconciles its own tasks."
            )
        done = self._call(
            args,
            lambda stub: stub.ResolveLostHost(pb.ResolveLostHostRequest(host_id=args.host_id), timeout=RPC_TIMEOUT_S),
        )
        print(done.message, file=out)
        if done.resolved_tasks:
            rows = [
                [t.task_id, t.title, pb.TaskState.Name(t.state).removeprefix("TASK_STATE_").lower()]
                for t in done.resolved_tasks
            ]
            print(render_table(["task", "title", "now"], rows), file=out)
        if done.left_tasks:
            print(
                f"{done.left_tasks} task(s) of host {done.host_id} wait in needs_reconciliation for another"
                " reason and were left alone",
                file=out,
            )
        if done.host_forgotten:
            print(f"host {done.host_id} was removed from the hosts table", file=out)
        return 0


def register(admin_sub: Any, settings: Callable[[], Settings]) -> None:
    """Add ``hosts list`` and ``hosts resolve`` under ``taskgate admin``."""
    commands = HostsCommands(settings)
    hosts = admin_sub.add_parser("hosts", help="scheduler hosts on a shared database (over gRPC, as the operator)")
    sub = hosts.add_subparsers(dest="action", required=True)
    listing = sub.add_parser("list", help="hosts with their lease and the unfinished tasks each holds")
    listing.add_argument("--addr", help="a scheduler replica's gRPC address (TASKGATE_SCHEDULER_ADDR)")
    listing.set_defaults(fn=commands.list)
    resolve = sub.add_parser(
        "resolve",
        help=(
            "settle a lost host's HOST_LOST and CLEANUP_UNCONFIRMED tasks by their kept outcome, on your word"
            " that the host is gone"
        ),
    )
    resolve.add_argument("host_id")
    resolve.add_argument(
        "--host-is-gone",
        action="store_true",
        help="required: you assert the host is gone for good and its workers with it",
    )
    resolve.add_argument("--addr", help="a scheduler replica's gRPC address (TASKGATE_SCHEDULER_ADDR)")
    resolve.set_defaults(fn=commands.resolve)
