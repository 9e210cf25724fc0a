"""start_eagerly: a coroutine's first step runs in the caller's turn, the rest as a task would run
it — its result, its errors, its context and its cancellation the same."""

from __future__ import annotations

import asyncio
import contextvars

import pytest

from services.scheduler.eager import start_eagerly

said: contextvars.ContextVar[str] = contextvars.ContextVar("said", default="nothing")


async def test_a_coroutine_that_never_waits_is_done_before_the_call_returns() -> None:
    steps: list[str] = []

    async def quick() -> int:
        steps.append("ran")
        return 7

    done = start_eagerly(quick())
    assert steps == ["ran"] and done.done() and done.result() == 7


async def test_the_first_step_runs_at_once_and_the_rest_after_what_it_waits_for() -> None:
    steps: list[str] = []
    gate: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def two_steps() -> str:
        steps.append("before")
        got = await gate
        steps.append(f"after {got}")
        await asyncio.sleep(0)  # a bare yield
        await asyncio.sleep(0.01)
        return got.upper()

    task = start_eagerly(two_steps(), name="two-steps")
    assert steps == ["before"], "the first step ran before start_eagerly returned"
    assert isinstance(task, asyncio.Task) and task.get_name() == "two-steps" and not task.done()
    gate.set_result("go")
    assert await task == "GO"
    assert steps == ["before", "after go"]


async def test_errors_are_its_outcome_before_and_after_a_wait() -> None:
    async def fails_at_once() -> None:
        raise ValueError("first")

    early = start_eagerly(fails_at_once())
    with pytest.raises(ValueError, match="first"):
        await early

    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def fails_later() -> None:
        await gate
        raise KeyError("later")

    late = start_eagerly(fails_later())
    gate.set_result(None)
    with pytest.raises(KeyError):
        await late


async def test_a_coroutine_that_cancels_itself_at_once_is_cancelled_as_a_task_would_be() -> None:
    async def gives_up() -> None:
        raise asyncio.CancelledError

    outcome = start_eagerly(gives_up())
    assert outcome.cancelled(), "a cancelled outcome, not an error holding CancelledError"
    with pytest.raises(asyncio.CancelledError):
        await outcome


async def test_an_interrupt_in_the_first_step_goes_on_up_as_from_a_task() -> None:
    async def interrupted() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        start_eagerly(interrupted())


async def test_the_error_of_what_it_waits_for_is_raised_inside_it() -> None:
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def catches() -> str:
        try:
            await gate
        except RuntimeError as exc:
            return f"caught {exc}"
        return "not raised"

    task = start_eagerly(catches())
    gate.set_exception(RuntimeError("boom"))
    assert await task == "caught boom"


async def test_what_it_binds_in_its_context_stays_its_own() -> None:
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def binds() -> str:
        said.set("mine")
        await gate
        return said.get()

    task = start_eagerly(binds())
    assert said.get() == "nothing", "the first step's binding leaked into the caller"
    gate.set_result(None)
    assert await task == "mine", "the rest did not run in the first step's context"


async def _waits_for(gate: asyncio.Future[str], seen: list[str]) -> None:
    try:
        await gate
    except asyncio.CancelledError:
        seen.append("cancelled")
        raise
    seen.append("went on")


async def test_a_cancel_while_it_waits_reaches_it_and_cancels_what_it_waits_for() -> None:
    gate: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    seen: list[str] = []
    task = start_eagerly(_waits_for(gate, seen))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen == ["cancelled"] and gate.cancelled() and task.cancelled()


async def test_a_cancel_after_what_it_waits_for_is_done_is_thrown_into_it() -> None:
    """The future it waits on is done but the task has not run yet when the cancel comes: the
    cancel cannot go through the future, and must not be lost."""
    gate: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    seen: list[str] = []
    task = start_eagerly(_waits_for(gate, seen))
    await asyncio.sleep(0)
    gate.set_result("done")
    task.cancel()  # same turn: the task's wake-up is due, not run
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen == ["cancelled"]
