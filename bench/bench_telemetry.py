"""Telemetry agent: cost of sampling one tree, and the agent's CPU share at 200 trees.

Run: .venv/bin/python bench/bench_telemetry.py   (or `make bench`)

1. Microseconds to sample one tree of 1, 10 and 100 real sleeping processes with
   the agent's Sampler (one /proc table scan + each member's figures read from
   /proc/<pid>/io and /proc/<pid>/stat), next to the psutil oneshot() reader and
   bare psutil calls as the floor.
2. CPU share of a real `python -m services.telemetry_agent` process while it
   watches 200 trees at a 1 s interval, ~8 s per row (aim: under 5% of one
   core): with no subscriber, with one reading one observation per response
   (the default), and with one reading a batch per sample.
Every process it starts is killed (by process group) before it exits.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from libs import proctree  # noqa: E402
from services.telemetry_agent.domain import Watch  # noqa: E402
from services.telemetry_agent.procread import ProcfsReader, PsutilReader  # noqa: E402
from services.telemetry_agent.sampler import Sampler  # noqa: E402
from taskgate.telemetry.v1 import telemetry_pb2 as pb  # noqa: E402
from taskgate.telemetry.v1 import telemetry_pb2_grpc as pb_grpc  # noqa: E402
from tests.support.procs import ServiceProcess, free_port  # noqa: E402
from tests.support.procs import channel as service_channel  # noqa: E402

TREE_SIZES = (1, 10, 100)
N_TREES = 200
INTERVAL_MS = 1000
WINDOW_S = 8.0
SLEEP = shutil.which("sleep") or "/bin/sleep"


class Spawned:
    """Sleeping process trees in their own process groups, killed on close()."""

    def __init__(self) -> None:
        self.roots: list[subprocess.Popen[bytes]] = []

    def tree(self, size: int) -> tuple[int, int]:
        """A root `sh` with size-1 sleeping children; returns (pid, start time) once all are up."""
        script = f"for i in $(seq {size - 1}); do {SLEEP} 1000 & done; wait" if size > 1 else f"exec {SLEEP} 1000"
        root = subprocess.Popen(["/bin/sh", "-c", script], start_new_session=True)
        self.roots.append(root)
        deadline = time.monotonic() + 30
        while True:
            table = proctree.process_table()
            stat = table.get(root.pid)
            # `exec sleep` keeps the pid; wait until the exec happened (1) or every child is up.
            if stat is not None and len(proctree.live_descendants(table, root.pid)) == size - 1:
                if size > 1 or _exe_is_sleep(root.pid):
                    return root.pid, stat.start_time
            if time.monotonic() > deadline:
                raise RuntimeError(f"tree of {size} did not come up")
            time.sleep(0.01)

    def close(self) -> None:
        for root in self.roots:
            try:
                os.killpg(root.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for root in self.roots:
            root.wait()
        self.roots.clear()


def _exe_is_sleep(pid: int) -> bool:
    try:
        return os.path.basename(os.readlink(f"/proc/{pid}/exe")) == "sleep"
    except OSError:
        return False


def per_call_us(fn: Callable[[], object], min_time_s: float = 0.3, max_reps: int = 2000) -> float:
    fn()  # warm
    reps, start = 0, time.perf_counter()
    while reps < max_reps and (reps < 5 or time.perf_counter() - start < min_time_s):
        fn()
        reps += 1
    return (time.perf_counter() - start) / reps * 1e6


def psutil_floor(pids: list[int]) -> None:
    for pid in pids:
        p = psutil.Process(pid)
        with p.oneshot():
            p.cpu_times()
            p.io_counters()
            p.create_time()


def sample_costs(spawned: Spawned) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for size in TREE_SIZES:
        pid, start = spawned.tree(size)
        watch = Watch(f"tree-{size}", pid, start)
        sampler = Sampler(ProcfsReader())
        obs = sampler.sample([watch])[0]
        assert obs.available and len(obs.members) == size, obs
        members = [m.pid for m in obs.members]
        table_size = len(proctree.process_table())
        full = per_call_us(lambda w=watch, s=sampler: s.sample([w]))  # type: ignore[misc]
        scan = per_call_us(proctree.process_table)
        procfs, ps_reader = ProcfsReader(), PsutilReader()
        reads = per_call_us(lambda r=procfs, ms=obs.members: [r.read(m.pid, m.start_time) for m in ms])  # type: ignore[misc]
        ps_reads = per_call_us(lambda r=ps_reader, ms=obs.members: [r.read(m.pid, m.start_time) for m in ms])  # type: ignore[misc]
        floor = per_call_us(lambda ps=members: psutil_floor(ps))  # type: ignore[misc]
        children = per_call_us(lambda p=pid: psutil.Process(p).children(recursive=True))  # type: ignore[misc]
        rows.append(
            (
                str(size),
                str(table_size),
                f"{full:,.0f}",
                f"{scan:,.0f}",
                f"{reads / size:,.1f}",
                f"{ps_reads / size:,.1f}",
                f"{floor / size:,.1f}",
                f"{children:,.0f}",
            )
        )
    return rows


def print_table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    """The first column left-aligned, the figures right-aligned."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]

    def line(cells: tuple[str, ...]) -> str:
        return "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    print(line(header))
    print(line(tuple("-" * w for w in widths)))
    for row in rows:
        print(line(row))


def agent_cpu_share(spawned: Spawned, tmp: Path) -> None:
    trees = [spawned.tree(1) for _ in range(N_TREES)]
    addr = f"127.0.0.1:{free_port()}"
    env = {
        "TASKGATE_TELEMETRY_ADDR": addr,
        "TASKGATE_TASKS_OBSERVATION_INTERVAL_MS": str(INTERVAL_MS),
        "TASKGATE_DATA_DIR": str(tmp / "data"),
    }
    agent = ServiceProcess("services.telemetry_agent", env, tmp / "agent.log", addr)
    agent.start()
    assert agent.proc is not None
    agent_ps = psutil.Process(agent.proc.pid)
    rows: list[tuple[str, ...]] = []

    def cpu_s() -> float:
        t = agent_ps.cpu_times()
        return float(t.user + t.system)

    def measure(label: str, counter: list[int] | None) -> float:
        before = counter[0] if counter else 0
        cpu0, t0 = cpu_s(), time.monotonic()
        time.sleep(WINDOW_S)
        cpu1, t1 = cpu_s(), time.monotonic()
        share = (cpu1 - cpu0) / (t1 - t0)
        ticks = (t1 - t0) / (INTERVAL_MS / 1000)
        streamed = str(counter[0] - before) if counter else "-"
        rows.append(
            (
                label,
                streamed,
                f"{share * 100:.2f}%",
                f"{(cpu1 - cpu0) / ticks * 1000:.1f} ms",
                "OK" if share < 0.05 else "ABOVE 5%",
            )
        )
        return share

    try:
        with service_channel(addr, env, "scheduler") as channel:
            stub = pb_grpc.TelemetryAgentServiceStub(channel)
            measure("idle agent, 0 trees", None)
            for i, (pid, start) in enumerate(trees):
                stub.Watch(pb.WatchRequest(task_id=f"bench-{i:03d}", pid=pid, pid_start_time=start), timeout=5)
            time.sleep(1.5)  # the baselines, then steady ticks
            measure(f"{N_TREES} trees, no subscriber", None)
            for batch in (False, True):
                counter = [0]
                stream = stub.StreamObservations(pb.StreamObservationsRequest(batch=batch), timeout=120)
                stream.initial_metadata()

                def consume(stream: grpc.Future = stream, counter: list[int] = counter) -> None:
                    try:
                        for response in stream:
                            counter[0] += len(response.observations) if response.observations else 1
                    except grpc.RpcError:
                        pass

                reader = threading.Thread(target=consume, daemon=True)
                reader.start()
                time.sleep(1.2)  # past one tick with the subscriber attached
                mode = "a batch per sample" if batch else "one observation per response"
                measure(f"{N_TREES} trees, 1 subscriber, {mode}", counter)
                stream.cancel()
                reader.join(timeout=5)
    finally:
        agent.stop()
    print_table(("agent process", "observations", "CPU (one core)", "per 1 s tick", "aim <5%"), rows)


def main() -> None:
    if not sys.platform.startswith("linux"):
        sys.exit("the telemetry agent samples Linux /proc; nothing to measure here")
    started = time.monotonic()
    spawned = Spawned()
    try:
        print(f"sampling one tree (psutil {psutil.__version__}, {os.cpu_count()} cpus); times in µs per call\n")
        print_table(
            (
                "tree",
                "procs on host",
                "agent sample",
                "of it: /proc scan",
                "read/member",
                "psutil reader/member",
                "floor: psutil oneshot/process",
                "psutil children(recursive)",
            ),
            sample_costs(spawned),
        )
        print(
            "\nagent sample = Sampler.sample([tree]) as the agent runs it: one /proc table scan (shared by"
            "\n  every tree of a tick) + per member /proc/<pid>/io and /proc/<pid>/stat (read/member)."
            "\npsutil reader = the same figures inside psutil oneshot(cpu_times, io_counters) + start-time check."
            "\nfloor = psutil.Process(pid) + oneshot(cpu_times, io_counters, create_time) per process;"
            "\n  children(recursive=True) is what a per-tree membership scan would cost instead.\n"
        )
        spawned.close()
        with tempfile.TemporaryDirectory() as tmp:
            print(
                f"agent process (python -m services.telemetry_agent) watching {N_TREES} trees"
                f" of 1 sleeping process, interval {INTERVAL_MS} ms\n"
            )
            agent_cpu_share(spawned, Path(tmp))
    finally:
        spawned.close()
    print(f"\n(total {time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
