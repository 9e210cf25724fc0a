"""Task throughput, launch rate and cancel latency against the real five-process system.

Run: .venv/bin/python bench/bench_tasks.py   (or `make bench`)
     .venv/bin/python bench/bench_tasks.py --throughput 1000 [--rounds 3] [--profile out.svg] [--json out.json]
       [--data-root DIR] [--creates-in-flight 16]
       only REST created -> completed for N `/bin/true` workers, a fresh stack per round, with
       the CPU per task of every process (scheduler, gateway, notifier, telemetry, pending, the
       client itself), each task's createdAt -> endedAt latency (and a py-spy flame graph of the
       scheduler when asked); --json writes the rounds for bench/compare_peers.py, the CPU
       figures in each round's ``extra`` as ``<process>_cpu_ms_per_task``. Its creates and
       completion poll go through bench/lean_http.py, a client that costs little CPU, with
       --creates-in-flight creates at a time (16).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import grpc
import httpx
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.lean_http import LeanClient  # noqa: E402
from bench.stats import (  # noqa: E402
    CpuTimes,
    Profile,
    children_cpu_seconds,
    cpu_fields,
    cpu_seconds,
    create_cost_us,
    data_disk,
    launch_step_means_ms,
    launch_steps,
    own_cpu_seconds,
    pct,
    postgres_cpu_seconds,
    store_counters,
)
from libs.grpc_client import aio_channel  # noqa: E402
from services.scheduler.metrics import LAUNCH_STEPS  # noqa: E402
from taskgate.scheduler.v1 import scheduler_pb2 as pb  # noqa: E402
from taskgate.scheduler.v1 import scheduler_pb2_grpc as pb_grpc  # noqa: E402
from tests.e2e.conftest import add_member, create_key  # noqa: E402
from tests.support.postgres import PostgresUnavailable, throwaway_cluster  # noqa: E402
from tests.support.procs import client_security  # noqa: E402
from tests.support.stack import Stack, StackTasks, make_stack  # noqa: E402

AGENT, SESSION = "agent-1", "cli-bench"
N_THROUGHPUT = 200
N_LAUNCH = 40
N_CANCEL = 8
N_ANSWER = 20


async def wait_states(
    channel: grpc.aio.Channel, task_ids: set[str], states: set[int], timeout_s: float
) -> dict[str, float]:
    """Follow the session's WatchTasks stream; returns when each task first reached one of ``states``."""
    reached: dict[str, float] = {}
    stream = pb_grpc.SchedulerServiceStub(channel).WatchTasks(
        pb.WatchTasksRequest(agent_id=AGENT, session_id=SESSION), timeout=timeout_s
    )
    async for event in stream:
        if event.task.task_id in task_ids and event.task.state in states and event.task.task_id not in reached:
            reached[event.task.task_id] = time.perf_counter()
            if len(reached) == len(task_ids):
                stream.cancel()
                break
    return reached


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        stack = make_stack(Path(tmp), max_running=64, cancel_grace_ms=1000)
        print("starting the five services ...", flush=True)
        stack.start()
        try:
            key = create_key(stack, "bench", AGENT)
            add_member(stack, AGENT, SESSION, "bench")
            base = f"{stack.http_url}/api/v1/agents/{AGENT}/sessions/{SESSION}"
            headers = {"Authorization": f"Bearer {key}"}
            channel = aio_channel(stack.addr("scheduler"), client_security(stack.env))
            async with httpx.AsyncClient(headers=headers, timeout=60) as http:

                async def create(profile: str, instructions: str = "") -> str:
                    r = await http.post(
                        f"{base}/tasks", json={"title": "b", "profile": profile, "instructions": instructions}
                    )
                    r.raise_for_status()
                    return str(r.json()["task"]["taskId"])

                # 1. REST created -> completed, a worker that exits at once.
                print(f"throughput: {N_THROUGHPUT} tasks, worker `python -c pass` ...", flush=True)
                began = time.perf_counter()
                sem = asyncio.Semaphore(16)

                async def bounded() -> str:
                    async with sem:
                        return await create("exit-at-once")

                watcher_ids: set[str] = set()
                ids = await asyncio.gather(*(bounded() for _ in range(N_THROUGHPUT)))
                watcher_ids.update(ids)
                created_s = time.perf_counter() - began
                while True:
                    r = await http.get(f"{base}/tasks", params={"page_size": 1})
                    if r.json()["total"] == 0:
                        break
                    await asyncio.sleep(0.05)
                total_s = time.perf_counter() - began
                r = await http.get(f"{base}/tasks", params={"all": "true", "page_size": 100})
                throughput = N_THROUGHPUT / total_s

                # 2. Launch rate: queued -> running for N sleepers at once, next to bare asyncio spawns.
                print(f"launch rate: {N_LAUNCH} sleepers ...", flush=True)
                waiter_ids: set[str] = set()
                began = time.perf_counter()
                launch_ids = await asyncio.gather(*(create("sleeper") for _ in range(N_LAUNCH)))
                waiter_ids.update(launch_ids)
                await wait_states(channel, waiter_ids, {pb.TASK_STATE_RUNNING}, 120)
                launch_s = time.perf_counter() - began
                cancelled = asyncio.create_task(wait_states(channel, waiter_ids, {pb.TASK_STATE_CANCELLED}, 120))
                await asyncio.sleep(0.1)  # let the watch subscribe
                await asyncio.gather(*(http.post(f"{base}/tasks/{task_id}/cancel") for task_id in launch_ids))
                await cancelled
                began = time.perf_counter()
                procs = [
                    await asyncio.create_subprocess_exec("sleep", "300", start_new_session=True)
                    for _ in range(N_LAUNCH)
                ]
                floor_s = time.perf_counter() - began
                for p in procs:
                    p.kill()
                    await p.wait()

                # 3. Cancel latency: REST call -> `cancelled` seen on the watch stream.
                latencies: dict[str, list[float]] = {"cooperative": [], "ignores SIGTERM": []}
                for label, profile, instructions in [
                    ("cooperative", "sleeper", ""),
                    (
                        "ignores SIGTERM",
                        "behave",
                        json.dumps([{"trap_term": True}, {"progress": "ready"}, {"sleep": 300}]),
                    ),
                ]:
                    print(f"cancel latency: {N_CANCEL} x {label} ...", flush=True)
                    for _ in range(N_CANCEL):
                        task_id = await create(profile, instructions)
                        if profile == "behave":
                            await _wait(channel, task_id, lambda t: t.progress.text == "ready")
                        else:
                            await _wait(channel, task_id, lambda t: t.state == pb.TASK_STATE_RUNNING)
                        watch = asyncio.create_task(wait_states(channel, {task_id}, {pb.TASK_STATE_CANCELLED}, 60))
                        await asyncio.sleep(0.05)  # let the watch subscribe
                        t0 = time.perf_counter()
                        await http.post(f"{base}/tasks/{task_id}/cancel")
                        reached = await watch
                        latencies[label].append((reached[task_id] - t0) * 1000)
                # 4. REST answer -> the worker has it (the task is running again).
                print(f"answer latency: {N_ANSWER} questions ...", flush=True)
                answer_ms: list[float] = []
                steps = json.dumps([{"ask": "go on?"}, {"sleep": 300}])
                for _ in range(N_ANSWER):
                    task_id = await create("behave", steps)
                    await _wait(channel, task_id, lambda t: t.state == pb.TASK_STATE_WAITING_INPUT)
                    r = await http.get(f"{base}/tasks/{task_id}")
                    question_id = r.json()["task"]["pendingQuestion"]["questionId"]
                    watch = asyncio.create_task(wait_states(channel, {task_id}, {pb.TASK_STATE_RUNNING}, 60))
                    await asyncio.sleep(0.05)
                    t0 = time.perf_counter()
                    r = await http.post(
                        f"{base}/tasks/{task_id}/answer", json={"questionId": question_id, "answer": "y"}
                    )
                    r.raise_for_status()
                    reached = await watch
                    answer_ms.append((reached[task_id] - t0) * 1000)
                    await http.post(f"{base}/tasks/{task_id}/cancel")
            await channel.close()
        finally:
            stack.stop()

    print()
    print("taskgate bench_tasks (5 real processes, SQLite, loopback, 2 cores)")
    print(
        f"  REST created->completed, exit-at-once worker, N={N_THROUGHPUT}: {throughput:7.1f} tasks/s "
        f"({total_s:.2f} s total; all {N_THROUGHPUT} creates answered after {created_s:.2f} s)"
    )
    print(
        f"  worker launches, queued->running, N={N_LAUNCH}:            {N_LAUNCH / launch_s:7.1f} /s "
        f"(floor: bare asyncio.create_subprocess_exec {N_LAUNCH / floor_s:7.1f} /s; ratio "
        f"{(N_LAUNCH / floor_s) / (N_LAUNCH / launch_s):.1f}x)"
    )
    print(
        f"  REST answer -> worker has it (task running again): p50 {statistics.median(answer_ms):7.1f} ms  "
        f"p99 {pct(answer_ms, 0.99):7.1f} ms  (n={len(answer_ms)})"
    )
    for label, values in latencies.items():
        print(
            f"  cancel latency, {label:<16} (grace 1000 ms): p50 {statistics.median(values):7.1f} ms  "
            f"max {max(values):7.1f} ms  (n={len(values)})"
        )


# The per-process CPU breakdown, in this order; "client" is this process (the load generator).
CPU_PROCESSES = ("scheduler", "gateway", "notifier", "telemetry", "pending")
# With the spawn helper (services/scheduler/hold/taskgate-spawn, a child of the scheduler):
# its CPU, counted with the services.
SPAWN_HELPER = "spawner"


def spawn_helper_pids(scheduler_pid: int) -> list[int]:
    """The scheduler's spawn helpers (its children named taskgate-spawn), if it runs any."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "comm").read_text().strip() != "taskgate-spawn":
                continue
            if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == scheduler_pid:
                pids.append(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue
    return pids


def thread_cpu_seconds(pid: int) -> dict[str, float]:
    """The process's CPU so far by thread kind — ``loop`` for the main thread (the event loop),
    else the kernel's thread name without its number (``db_0`` -> ``db``; the services name their
    threads, libs/thread_names.py; a library's thread started later inherits its creator's
    name) — with the system part apart: ``{"db": ..., "db:sys": ...}``. A thread that ended is
    no longer counted."""
    out: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            user, system, _, _ = cpu_fields(task / "stat")
        except OSError:  # the thread ended meanwhile
            continue
        kind = "loop" if task.name == str(pid) else (name.rstrip("0123456789").rstrip("_-") or name)
        out[kind] = out.get(kind, 0.0) + user + system
        out[f"{kind}:sys"] = out.get(f"{kind}:sys", 0.0) + system
    return out


class CpuMeter:
    """CPU seconds of each service process, of the scheduler's threads by kind, of its reaped
    workers and of this client between ``start`` and ``stop``; ``per_task_ms`` divides by the
    task count."""

    def __init__(self, pids: dict[str, int], helpers: list[int]) -> None:
        self.pids = pids
        self.helpers = helpers  # the spawn helpers': counted together as SPAWN_HELPER
        self.began: dict[str, float] = {}
        self.used: dict[str, float] = {}

    def _sample(self) -> dict[str, float]:
        out = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        if PG_URL is not None:  # the cluster's own processes (its backends serve the services)
            out["postgres"] = postgres_cpu_seconds(int(PG_URL.rsplit(":", 1)[1].split("/")[0]))
        out[SPAWN_HELPER] = sum(cpu_seconds(pid) for pid in self.helpers)
        out["workers"] = children_cpu_seconds(self.pids["scheduler"])
        out["client"] = own_cpu_seconds()
        out.update({f"thread:{kind}": s for kind, s in thread_cpu_seconds(self.pids["scheduler"]).items()})
        return out

    def start(self) -> None:
        self.began = self._sample()

    def stop(self) -> None:
        end = self._sample()
        self.used = {name: end[name] - self.began.get(name, 0.0) for name in end}  # a thread may start meanwhile

    def per_task_ms(self, n: int) -> dict[str, float]:
        return {name: used * 1000 / n for name, used in self.used.items()}


def cpu_line(per_task: dict[str, float]) -> str:
    services = sum(per_task[name] for name in (*CPU_PROCESSES, SPAWN_HELPER))
    parts = [f"{name} {per_task[name]:.2f}" for name in (*CPU_PROCESSES, SPAWN_HELPER, "client")]
    if "postgres" in per_task:
        parts.append(f"PostgreSQL's processes {per_task['postgres']:.2f}")
    return (
        f"CPU ms/task: {', '.join(parts)} (services {services:.2f}; workers, reaped {per_task['workers']:.2f}; "
        f"gateway per create request {per_task['gateway_per_create']:.2f}, {per_task['polls']:.0f} list polls; "
        f"the creates took {100 * per_task['creates_share']:.0f} % of the run)"
    )


async def scheduler_counters_of(
    metrics_url: str,
) -> tuple[tuple[dict[str, tuple[float, float]], dict[str, float]], dict[str, tuple[float, float]]]:
    """The scheduler's store units and group-commit counters so far (``stats.store_counters``),
    and its launch steps (``stats.launch_steps``), from one read of its metrics."""
    async with httpx.AsyncClient(timeout=10) as http:
        page = (await http.get(metrics_url)).text
    families = list(text_string_to_metric_families(page))
    return store_counters(families), launch_steps(families)


def store_per_task(
    before: tuple[dict[str, tuple[float, float]], dict[str, float]],
    after: tuple[dict[str, tuple[float, float]], dict[str, float]],
    n: int,
) -> dict[str, float]:
    """``unit:<call>`` (units per task), ``unit:<call>:us`` (µs of CPU per unit) and
    ``unit:<call>:ms`` (ms of CPU per task) for each store call the run made; and the group
    commit's ``transactions`` and ``reruns`` per task."""
    out: dict[str, float] = {}
    for unit, (count, cpu) in after[0].items():
        count -= before[0].get(unit, (0.0, 0.0))[0]
        cpu -= before[0].get(unit, (0.0, 0.0))[1]
        if count > 0:
            out[f"unit:{unit}"] = count / n
            out[f"unit:{unit}:us"] = 1e6 * cpu / count
            out[f"unit:{unit}:ms"] = 1e3 * cpu / n
    for name, value in after[1].items():
        out[name] = (value - before[1].get(name, 0.0)) / n
    return out


def units_line(per_task: dict[str, float]) -> str:
    """The store units' CPU per task by store call, heaviest first, and — on PostgreSQL, where
    every unit runs on the database threads — what is left of their time outside the units
    (transactions' begin, savepoints, commit; other work). On SQLite a batch commits on the
    event loop while the database thread is idle, so the thread's CPU less the units' says
    nothing there."""
    units = sorted(
        (k.removeprefix("unit:").removesuffix(":ms") for k in per_task if k.startswith("unit:") and k.endswith(":ms")),
        key=lambda unit: -per_task[f"unit:{unit}:ms"],
    )
    inside = sum(per_task[f"unit:{u}:ms"] for u in units)
    parts = [
        f"{u} {per_task[f'unit:{u}:ms']:.2f} ({per_task[f'unit:{u}']:.2f}/task x {per_task[f'unit:{u}:us']:.0f} us)"
        for u in units
        if per_task[f"unit:{u}:ms"] >= 0.005
    ]
    outside = f"outside the units {per_task.get('thread:db', 0.0) - inside:.2f} " if PG_URL else ""
    where = [
        f"{per_task[f'batches:{on}:count']:.3f}/task on the {on}, mean "
        f"{1e3 * per_task.get(f'batches:{on}:sum', 0.0) / per_task[f'batches:{on}:count']:.2f} ms"
        for on in ("loop", "thread")
        if per_task.get(f"batches:{on}:count", 0.0) > 0
    ]
    return (
        f"store units ms/task by store call (their thread's CPU): {', '.join(parts)}; {outside}"
        f"({per_task.get('transactions', 0.0):.3f} transactions per task, "
        f"{per_task.get('reruns', 0.0) * 1000:.1f} reruns per 1,000 tasks"
        f"{'; batches ' + ', '.join(where) if where else ''})"
    )


def threads_line(per_task: dict[str, float]) -> str:
    """The scheduler's CPU per task by thread kind, heaviest first, each with its system (kernel)
    share: ``loop`` the event loop, ``db`` the database threads, ``asyncio`` the loop's executor
    (spawns, process-table reads, cgroup and file work), ``event_engine`` gRPC's own threads."""
    kinds = sorted(
        (k.removeprefix("thread:") for k in per_task if k.startswith("thread:") and not k.endswith(":sys")),
        key=lambda kind: -per_task[f"thread:{kind}"],
    )
    shown = [k for k in kinds if per_task[f"thread:{k}"] >= 0.01]
    parts = [f"{k} {per_task[f'thread:{k}']:.2f} (sys {per_task.get(f'thread:{k}:sys', 0.0):.2f})" for k in shown]
    return "scheduler threads ms/task: " + ", ".join(parts)


def launch_line(figures: dict[str, float]) -> str:
    """The mean wall time of each launch step (the scheduler's taskgate_task_launch_step_seconds):
    where a launch waits between its claim and its worker committed running."""
    steps = [(step, figures[f"launch:{step}"]) for step in LAUNCH_STEPS if f"launch:{step}" in figures]
    if not steps:
        return "launch steps: none timed"
    parts = ", ".join(f"{step} {ms:.1f}" for step, ms in steps)
    return f"launch steps, mean wall ms: {parts} (claim -> running {sum(ms for _, ms in steps):.1f})"


def conditions_line(figures: dict[str, float]) -> str:
    """How saturated the run was and what a log file cost to create: a throughput figure means
    little without them on a shared VM."""
    proofs = figures.get("exit_proofs:kernel", 0.0) + figures.get("exit_proofs:table", 0.0)
    kernel = (
        f"; {100 * figures.get('exit_proofs:kernel', 0.0) / proofs:.0f} % of exits proven by the kernel alone"
        if proofs
        else ""
    )
    return (
        f"during the run: the scheduler kept {figures['scheduler_cores']:.2f} of a core busy, the machine "
        f"{100 * figures['machine_busy']:.0f} % of its {os.cpu_count()} CPUs; a file create on the data disk "
        f"took {figures['file_create_us']:.0f} us just before{kernel}; the scheduler spent "
        f"{scheduler_per_worker(figures):.2f}x the workers' own CPU (compare runs by this)"
    )


def scheduler_per_worker(figures: dict[str, float]) -> float:
    """The scheduler's CPU per task in units of the workers' own: a `/bin/true` exec is the same
    work in every run, so its CPU tracks how fast this VM is at the moment (it drifts by up to 2x
    within minutes); divided by it, the scheduler's cost compares across runs."""
    return figures["scheduler"] / figures["workers"] if figures.get("workers") else float("nan")


def _instant(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


async def task_latencies_ms(http: httpx.AsyncClient, base: str) -> tuple[list[float], list[float], list[float]]:
    """Per finished task of the session (the scheduler's own clock, ms): createdAt -> endedAt,
    and its two parts: createdAt -> startedAt (queued, claimed, spawned, released) and
    startedAt -> endedAt (the worker's run, its exit seen, proven and committed)."""
    total: list[float] = []
    to_start: list[float] = []
    running: list[float] = []
    page, pages = 0, 1
    while page < pages:
        r = await http.get(f"{base}/tasks", params={"all": "true", "page_size": 100, "page": page})
        r.raise_for_status()
        body = r.json()
        pages = body["pages"]
        for task in body["tasks"]:
            timing = task.get("timing", {})
            if "createdAt" in timing and "endedAt" in timing:
                created, ended = _instant(timing["createdAt"]), _instant(timing["endedAt"])
                total.append((ended - created) * 1000)
                if "startedAt" in timing:
                    started = _instant(timing["startedAt"])
                    to_start.append((started - created) * 1000)
                    running.append((ended - started) * 1000)
        page += 1
    return total, to_start, running


def worker_hold_of(stack: Stack) -> str:
    """What the stack's scheduler holds its workers with, as it logged at start-up
    (``worker_hold``: "compiled" or "sh", with the reason it fell back)."""
    for line in stack.procs["scheduler"].log_path.read_text().splitlines():
        if '"worker_hold"' in line:
            said = json.loads(line)
            reason = said.get("fallback_reason")
            return f"{said['kind']} ({reason})" if reason else str(said["kind"])
    return "unknown (no worker_hold line in the scheduler's log)"


async def throughput_round(
    n: int, profile_to: str | None, base: Path
) -> tuple[float, dict[str, float], tuple[list[float], list[float], list[float]], str]:
    """(tasks/s created -> completed, CPU ms per task by process and by scheduler thread — plus
    the gateway's per create request alone and the number of list polls —, per-task latencies
    as ``task_latencies_ms`` gives them, what held the workers) for N
    `/bin/true` tasks. The creates and the completion poll go through the lean client: the
    client shares the cores with the services, and httpx cost ~2.4 ms of CPU per request.
    The stack's data goes to a new folder in ``base``, which the caller removes after its last
    round: a round's ~1,000 log files deleted right before the next round would make that
    round's creates pay for them on a disk like this VM's (``stats.data_disk``)."""
    tmp = tempfile.mkdtemp(prefix="round-", dir=base)
    stack = make_stack(Path(tmp), metrics=True, **THROUGHPUT_SETTINGS)
    if PG_URL is not None:  # every service's database in the throwaway cluster, fresh each round
        stack.use_postgresql(PG_URL, prefix="bench_")
    stack.start()
    try:
        key = create_key(stack, "bench", AGENT)
        add_member(stack, AGENT, SESSION, "bench")
        path = f"/api/v1/agents/{AGENT}/sessions/{SESSION}/tasks"
        pids = {}
        for name in CPU_PROCESSES:
            proc = stack.procs[name].proc
            assert proc is not None
            pids[name] = proc.pid
        helpers = spawn_helper_pids(pids["scheduler"])
        profile = await Profile.start(pids["scheduler"], profile_to)
        headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        # One keep-alive connection per create in flight, one request on each.
        async with LeanClient(stack.http_url, CREATES_IN_FLIGHT) as lean:
            create = lean.request("POST", path, headers, json.dumps({"title": "b", "profile": "true"}).encode())
            poll = lean.request("GET", f"{path}?page_size=1", headers)
            meter = CpuMeter(pids, helpers)
            store_before, steps_before = await scheduler_counters_of(stack.metrics_url("scheduler"))
            # What a worker's log file costs to create right now, on the disk its logs go to.
            create_us = create_cost_us(Path(tmp) / "create-probe")
            meter.start()
            machine_before = CpuTimes.now()
            began = time.perf_counter()
            await lean.repeat(create, n, expect=201)
            creates_s = time.perf_counter() - began
            # The gateway's share of the creates alone (the polls below cost it too).
            gateway_create_ms = (cpu_seconds(pids["gateway"]) - meter.began["gateway"]) * 1000 / n
            polls = 0
            while True:
                polls += 1
                answer = await lean.send(poll)
                if answer.status != 200:
                    raise RuntimeError(f"the task list answered {answer.status}: {answer.body[:300]!r}")
                if json.loads(answer.body)["total"] == 0:
                    break
                await asyncio.sleep(0.02)
            total_s = time.perf_counter() - began
            machine_busy = CpuTimes.now().busy_share_since(machine_before)
            meter.stop()
            store_after, steps_after = await scheduler_counters_of(stack.metrics_url("scheduler"))
            store = store_per_task(store_before, store_after, n)
            steps = launch_step_means_ms(steps_before, steps_after)
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=60) as http:
            session_url = f"{stack.http_url}{path.removesuffix('/tasks')}"
            r = await http.get(f"{session_url}/tasks", params={"all": "true", "page_size": 1})
            completed = r.json()["total"]
            assert completed == n, completed
            latencies = await task_latencies_ms(http, session_url)
        await profile.stop()
        figures = {
            **store,
            **meter.per_task_ms(n),
            "gateway_per_create": gateway_create_ms,
            "polls": float(polls),
            "creates_share": creates_s / total_s,
            **{f"launch:{step}": ms for step, ms in steps.items()},
            "file_create_us": create_us,
            "machine_busy": machine_busy,
            # Cores the scheduler kept busy: one process, most of its work under one GIL.
            "scheduler_cores": meter.used["scheduler"] / total_s,
        }
        return n / total_s, figures, latencies, worker_hold_of(stack)
    finally:
        stack.stop()


# The throwaway cluster every service's database is in (--postgres); None: SQLite under the data dir.
PG_URL: str | None = None

# Creates in flight in the throughput run (--creates-in-flight): 16 by default, the figure every run
# since issue 11 was filed has used. With 16 the run is a closed loop on a REST create's latency: at
# b6d31ca 32 and 64 in flight ran 720-727 and 767 tasks/s against 662 (docs/performance.md).
CREATES_IN_FLIGHT = 16


# The throughput run's [tasks] settings. The supervisor's and the telemetry agent's timers are at
# their shipped defaults (1 s, 15 s): the tests' stack ticks them every 100 / 200 ms, which cost
# the scheduler ~30 ms of CPU a second even when idle and the telemetry agent a process-table
# read per tick.
THROUGHPUT_SETTINGS = StackTasks(
    max_running=64,
    cancel_grace_ms=1000,
    supervisor_interval_ms=1000,
    observation_interval_ms=15000,
)


async def throughput_main(
    n: int, rounds: int, profile_to: str | None, json_to: str | None, data_root: str | None = None
) -> None:
    """``data_root``: the rounds' data folders go there and stay (the caller removes them, after
    its own last round); else into a temporary folder removed after the last round."""
    if data_root:
        Path(data_root).mkdir(parents=True, exist_ok=True)
        await _throughput_rounds(n, rounds, profile_to, json_to, Path(data_root))
        return
    with tempfile.TemporaryDirectory() as base:
        await _throughput_rounds(n, rounds, profile_to, json_to, Path(base))


def with_postgres(run: Callable[[], None]) -> None:
    """``run`` with every service on a throwaway PostgreSQL 15 cluster (``PG_URL``)."""
    global PG_URL
    try:
        with throwaway_cluster() as PG_URL:
            run()
    except PostgresUnavailable as exc:
        print(f"skipped: {exc}")
    finally:
        PG_URL = None


async def _throughput_rounds(n: int, rounds: int, profile_to: str | None, json_to: str | None, base: Path) -> None:
    rates, cpus, all_latencies, all_to_start, all_running, per_round = [], [], [], [], [], []
    disk = data_disk(base)
    print(f"data on {disk}" + ("; every service's database on a throwaway PostgreSQL 15 cluster" if PG_URL else ""))
    for r in range(rounds):
        rate, cpu, (latencies, to_start, running), held_by = await throughput_round(
            n, profile_to if r == 0 else None, base
        )
        if r == 0:
            print(f"workers held by {held_by}", flush=True)
        rates.append(rate)
        cpus.append(cpu)
        all_latencies.extend(latencies)
        all_to_start.extend(to_start)
        all_running.extend(running)
        extra = {f"{name}_cpu_ms_per_task": cpu[name] for name in (*CPU_PROCESSES, SPAWN_HELPER, "workers", "client")}
        extra.update(
            {
                f"scheduler_thread_{k.removeprefix('thread:').replace(':', '_')}_cpu_ms_per_task": v
                for k, v in cpu.items()
                if k.startswith("thread:")
            }
        )
        extra.update(
            {
                f"scheduler_db_{k.removeprefix('unit:').removesuffix(':ms')}_cpu_ms_per_task": v
                for k, v in cpu.items()
                if k.startswith("unit:") and k.endswith(":ms")
            }
        )
        extra["scheduler_transactions_per_task"] = cpu.get("transactions", 0.0)
        extra["scheduler_reruns_per_task"] = cpu.get("reruns", 0.0)
        extra["gateway_cpu_ms_per_create_request"] = cpu["gateway_per_create"]
        extra["creates_share_of_run"] = cpu["creates_share"]
        extra["file_create_us"] = cpu["file_create_us"]
        extra["machine_busy_share"] = cpu["machine_busy"]
        extra["scheduler_cores"] = cpu["scheduler_cores"]
        extra["scheduler_cpu_per_worker_cpu"] = scheduler_per_worker(cpu)
        extra.update({f"launch_{k.removeprefix('launch:')}_ms": v for k, v in cpu.items() if k.startswith("launch:")})
        per_round.append({"tasks_per_s": rate, "latencies_ms": latencies, "extra": extra})
        print(
            f"round {r + 1}/{rounds}: {rate:7.1f} tasks/s, created->ended p50 {pct(latencies, 0.5):7.1f} ms, "
            f"load {os.getloadavg()[0]:.2f}\n  {cpu_line(cpu)}\n  {threads_line(cpu)}\n  {units_line(cpu)}\n"
            f"  {launch_line(cpu)}\n  {conditions_line(cpu)}",
            flush=True,
        )
    names = {name for c in cpus for name in c}
    median_cpu = {name: statistics.median(c.get(name, 0.0) for c in cpus) for name in names}
    print(
        f"REST created->completed, /bin/true workers, N={n} (median of {rounds}): "
        f"{statistics.median(rates):7.1f} tasks/s, "
        f"created->ended p50 {pct(all_latencies, 0.5):7.1f} ms p99 {pct(all_latencies, 0.99):7.1f} ms "
        f"(created->started p50 {pct(all_to_start, 0.5):.1f} ms, started->ended p50 {pct(all_running, 0.5):.1f} ms)\n"
        f"  {cpu_line(median_cpu)}\n"
        f"  {threads_line(median_cpu)}\n"
        f"  {units_line(median_cpu)}\n"
        f"  {launch_line(median_cpu)}\n"
        f"  {conditions_line(median_cpu)}\n"
        f"  (client: the lean load generator, bench/lean_http.py; reproduce: "
        f".venv/bin/python bench/bench_tasks.py --throughput {n} --rounds {rounds}"
        f"{'' if CREATES_IN_FLIGHT == 16 else f' --creates-in-flight {CREATES_IN_FLIGHT}'}"
        f"{' --postgres' if PG_URL else ''})"
    )
    if json_to:
        config = {
            **THROUGHPUT_SETTINGS,
            "creates_in_flight": CREATES_IN_FLIGHT,
            "worker_hold": held_by,
            "data_disk": disk,
            "database": "postgresql" if PG_URL else "sqlite",
        }
        out = {"version": "taskgate", "config": config, "rounds": per_round}
        Path(json_to).write_text(json.dumps(out))


async def _wait(channel: grpc.aio.Channel, task_id: str, done: object) -> None:
    stream = pb_grpc.SchedulerServiceStub(channel).WatchTasks(pb.WatchTasksRequest(task_id=task_id), timeout=60)
    async for event in stream:
        if done(event.task):  # type: ignore[operator]
            stream.cancel()
            return


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--throughput", type=int, default=0, help="only created->completed for N /bin/true tasks")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", default=None, help="py-spy flame graph of the scheduler (first round)")
    parser.add_argument("--json", default=None, help="with --throughput: write the rounds to this file")
    parser.add_argument(
        "--data-root", default=None, help="with --throughput: the rounds' data folders go here and are kept"
    )
    parser.add_argument(
        "--creates-in-flight", type=int, default=CREATES_IN_FLIGHT, help="with --throughput: concurrent creates"
    )
    parser.add_argument(
        "--postgres",
        action="store_true",
        help="with --throughput: every service on a throwaway PostgreSQL 15 cluster (its processes' CPU too)",
    )
    args = parser.parse_args()
    CREATES_IN_FLIGHT = args.creates_in_flight
    if args.throughput:

        def run() -> None:
            asyncio.run(throughput_main(args.throughput, args.rounds, args.profile, args.json, args.data_root))

        if args.postgres:
            with_postgres(run)
        else:
            run()
    else:
        asyncio.run(main())
