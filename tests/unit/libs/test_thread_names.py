"""Threads carry their names into the kernel (what top -H, ps -L and perf show)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from libs.db import DatabaseThreads
from libs.thread_names import name_loop_threads, name_os_thread


def comm(native_id: int) -> str:
    return Path(f"/proc/self/task/{native_id}/comm").read_text().strip()


@pytest.fixture
def main_name() -> Iterator[str]:
    """The main thread's kernel name, put back after the test."""
    native_id = threading.main_thread().native_id
    assert native_id is not None  # started: it has one
    before = comm(native_id)
    yield before
    name_os_thread(before)


def test_a_thread_names_itself_cut_to_the_kernels_15_bytes() -> None:
    seen: list[str] = []

    def run() -> None:
        name_os_thread("db_7")
        seen.append(comm(threading.get_native_id()))
        name_os_thread("a-name-longer-than-fifteen")
        seen.append(comm(threading.get_native_id()))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert seen == ["db_7", "a-name-longer-t"]


def test_the_loop_its_executor_and_the_database_threads_are_named(main_name: str) -> None:
    async def main() -> tuple[str, str, str]:
        name_loop_threads("scheduler")
        loop_name = comm(threading.get_native_id())
        executor_name = await asyncio.to_thread(lambda: comm(threading.get_native_id()))
        threads = DatabaseThreads(1, name="db")
        try:
            db_name = await threads.run(lambda: comm(threading.get_native_id()))
        finally:
            threads.close()
        return loop_name, executor_name, db_name

    assert main_name != "scheduler"
    assert asyncio.run(main()) == ("scheduler", "asyncio_0", "db_0")
