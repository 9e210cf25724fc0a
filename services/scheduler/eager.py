"""Start a coroutine in the caller's own turn of the event loop; what it then waits for goes on
in a task — Python 3.12's eager tasks (``asyncio.eager_task_factory``), which 3.11 lacks.

Why: the StreamCreateTasks reader hands each batch it reads to a task of its own, and under load
the task's first step runs a turn of the loop later (≈ 2.5 ms on the throughput benchmark: every
callback already due runs first). That turn is a REST create's latency, and with a client's
creates in flight, its throughput. Started eagerly, a batch is admitted, committed (when the
database is free) and its answer's write begun within the turn its message was read.

The first step runs in a copy of the caller's context (as a task's would: what it binds stays
its own) but ``asyncio.current_task()`` is still the caller's during it, so the coroutine must
not enter ``asyncio.timeout`` (or anything bound to the current task) before it first waits.
Replace with ``asyncio.Task(coro, eager_start=True)`` on Python 3.12.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def start_eagerly(coro: Coroutine[Any, Any, T], name: str | None = None) -> asyncio.Future[T]:
    """``coro`` run up to its first wait right here, the rest in a task; its outcome."""
    loop = asyncio.get_running_loop()
    context = contextvars.copy_context()
    try:
        awaited = context.run(coro.send, None)
    except StopIteration as done:  # finished without waiting
        finished: asyncio.Future[T] = loop.create_future()
        finished.set_result(done.value)
        return finished
    except asyncio.CancelledError:  # cancelled itself: a cancelled outcome, as a task's
        cancelled: asyncio.Future[T] = loop.create_future()
        cancelled.cancel()
        return cancelled
    except (KeyboardInterrupt, SystemExit):  # as from a task's step: not kept, raised on
        raise
    except BaseException as exc:  # noqa: BLE001 - its outcome, as a task would hold it
        failed: asyncio.Future[T] = loop.create_future()
        failed.set_exception(exc)
        return failed
    return loop.create_task(_resume(coro, awaited), name=name, context=context)


async def _resume(coro: Coroutine[Any, Any, T], awaited: Any) -> T:
    """Go on with ``coro`` from where it waits on ``awaited`` (what it yielded), as a task
    running it would: once that is done, resume it — it reads the outcome itself; a cancel of
    this task reaches it the same way (the future it waits on cancelled, or thrown in)."""
    while True:
        thrown: BaseException | None = None
        try:
            if awaited is None:  # a bare yield (asyncio.sleep(0)): one turn
                await asyncio.sleep(0)
            else:
                awaited._asyncio_future_blocking = False
                await awaited
        except BaseException as exc:  # noqa: BLE001 - coro's to handle, or this task's cancel
            if awaited is None or not _outcome_of(awaited, exc):
                thrown = exc  # not what coro waited for: this task was cancelled after it was done
        try:
            awaited = coro.send(None) if thrown is None else coro.throw(thrown)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]


def _outcome_of(future: asyncio.Future[Any], exc: BaseException) -> bool:
    """Whether ``exc`` is ``future``'s own outcome (what ``future.result()`` raises)."""
    return future.done() and (future.cancelled() or future.exception() is exc)
