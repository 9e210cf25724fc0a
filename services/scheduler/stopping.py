"""Stop and proof: stopping an attempt's tree, and settling its task by what is proven.

A stop is SIGTERM, SIGKILL after the grace, then a look for proof (process group,
cgroup, recorded descendants — see ``processes.stop_tree``). Only a proven stop
settles the task; otherwise it needs reconciliation and ``retry_cleanup`` looks
again. Cancel is one cause of a stop among the supervisor's and shutdown's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import structlog

from libs import proctree
from libs.settings import WorkerProfile
from services.scheduler import containers, domain, processes
from services.scheduler.domain import Attempt, Cancellation, PendingOutcome, State, Task
from services.scheduler.metrics import EXIT_PROOFS
from services.scheduler.runtime import LiveAttempt, Runtime
from services.scheduler.settling import Settler

log = structlog.get_logger("scheduler")

# How many more shared reads an exit looks at while all that is left are orphans that fit
# several attempts (a launch's fork in flight lasts far less than one read interval).
UNATTRIBUTED_LOOKS = 5


_PROVEN_BY_KERNEL = EXIT_PROOFS.labels(by="kernel")
_PROVEN_BY_TABLE = EXIT_PROOFS.labels(by="table")


def _only_unattributed(status: processes.TreeStatus) -> bool:
    return bool(status.unattributed) and not (status.group or status.escaped or status.in_cgroup)


class Stopper:
    def __init__(self, rt: Runtime, settler: Settler) -> None:
        self.rt = rt
        self.settler = settler

    async def stop_tree(self, attempt: Attempt) -> processes.TreeStatus:
        """SIGTERM, SIGKILL after the grace, then look for proof (see ``processes.stop_tree``)."""
        cfg = self.rt.tasks_cfg
        # A container is stopped through its engine first: killing its host-side client (and,
        # in cgroup mode, the engine's monitor with it) would leave the engine unable to say.
        container = await self.stop_container(attempt)
        status = await processes.stop_tree(
            attempt,
            cfg.cancel_grace_ms / 1000,
            cfg.cleanup_confirm_ms / 1000,
            ctx=self.rt.ownership.stop_context(),
        )
        status.container = container
        if status.gone:
            self.rt.ownership.drop(attempt)
        return status

    async def stop_container(self, attempt: Attempt) -> str:
        """A container worker's container, stopped and proven by its engine ("" = proven or none).
        The host-side client having exited proves nothing about the container."""
        rt = self.rt
        if not any(p.container for p in rt.settings.workers.values()):
            return ""
        # Not from the live attempt: its own exit may have forgotten it while this stop runs,
        # and an earlier incarnation's attempt has none.
        task = await rt.store.find_task(attempt.task_id)
        profile = rt.settings.workers.get(task.profile) if task is not None else None
        spec = profile.container if profile is not None else None
        if spec is None:
            return ""
        grace_s = rt.tasks_cfg.cancel_grace_ms / 1000
        name = containers.container_name(attempt.attempt_id)
        why = await containers.ContainerEngine(spec).stop_and_prove(name, grace_s)
        if why:
            log.warning("container_stop_unproven", task_id=attempt.task_id, reason=why)
        return why

    async def reap_leftovers(self, live: LiveAttempt) -> None:
        """Processes a worker leaves behind (group, cgroup, recorded daemons) end with it."""
        ownership = self.rt.ownership
        attempt = live.attempt
        container = await self.stop_container(attempt)  # the client's exit is not the container's
        ctx = ownership.stop_context()

        def look(table: dict[int, proctree.ProcStat]) -> processes.TreeStatus:
            # The empty cgroup is removed in the same hop when nothing is left.
            return processes.look(attempt, ctx, table, remove_empty_cgroup=not container)

        proven = None
        if not container and ownership.kernel_may_prove():
            # Most often the kernel proves it alone, with no table read and no wait for one —
            # here on the loop: a hop to a thread cost more CPU than the proof's own calls.
            proven = processes.kernel_proof(attempt, ctx, remove_empty_cgroup=True)
        if proven is not None:
            _PROVEN_BY_KERNEL.inc()
            ownership.drop(attempt)
            return
        _PROVEN_BY_TABLE.inc()
        # On a table read after the exit, in that read's own hop to a thread (shared with the
        # other exits of the interval and the supervisor tick).
        status = await self.rt.scans.then(look)
        for _ in range(UNATTRIBUTED_LOOKS):
            # Only orphans that fit several attempts: most often the child of a launch whose
            # pid was not known at the read. They are never signalled, so a stop could only
            # wait for them; the next shared reads say the same for much less.
            if container or not _only_unattributed(status):
                break
            status = await self.rt.scans.then(look)
        status.container = container
        if status.gone:
            ownership.drop(attempt)
            return
        task_id = attempt.task_id
        log.info("reaping_leftover_processes", task_id=task_id, detail=status.describe())
        status = await self.stop_tree(attempt)
        if not status.gone:
            log.warning("leftover_processes_survive", task_id=task_id, detail=status.describe())

    async def stop_and_settle(self, live: LiveAttempt, why: str, message: str) -> Task:
        """Stop an attempt's tree; settle the task by what could be proven.

        ``why``: cancel | pause | stalled | max_duration | no_first_report | background | shutdown.
        """
        rt = self.rt
        task_id = live.attempt.task_id
        live.stopping = True
        status = await self.stop_tree(live.attempt)
        if live.process is not None and not live.exited.is_set():
            try:
                async with asyncio.timeout(1.0):
                    await live.exited.wait()
            except TimeoutError:
                pass
        attempt = live.attempt
        attempt.ended_at = attempt.ended_at or rt.clock.now_ms()
        attempt.outcome = f"stopped:{why}"
        attempt.state = "ended"
        async with rt.locks[task_id]:
            task = await rt.store.get_task(task_id)
            outcome = domain.stop_outcome(why, task, message)
            if status.gone:
                task = await self.settler.settle(task_id, outcome, attempt)
            else:
                log.warning("cleanup_unconfirmed", task_id=task_id, detail=status.describe())
                task = await self.settler.unconfirmed(task_id, outcome, attempt, status.describe())
        rt.forget(live)
        rt.wake.set()
        return task

    async def cancel(
        self,
        task_id: str,
        cause: str = domain.USER_CANCELED,
        replaced_by: str | None = None,
        wait_s: float = 0.0,
        before_stop: Callable[[], Awaitable[None]] | None = None,
    ) -> Task:
        """Request a cancel; returns the task (cancelled, cancel_requested or unchanged).

        ``before_stop`` runs after the task shows ``cancel_requested`` and before its worker is
        signalled (a parent's sub-tasks are stopped first, see ``subtasks``).
        """
        domain.validate_task_id(task_id)
        if replaced_by:
            domain.validate_task_id(replaced_by)
        return await self._stop_request(
            task_id, domain.validate_cause(cause), replaced_by, wait_s, "cancel", before_stop
        )

    async def pause(self, task_id: str, wait_s: float = 0.0) -> Task:
        """Stop the worker with the same proof as a cancel, and leave the task ``paused``
        (not terminal): its question and pending snapshot are kept (returns it paused,
        cancel_requested while stopping, or unchanged)."""
        domain.validate_task_id(task_id)
        return await self._stop_request(task_id, domain.PAUSE_CAUSE, None, wait_s, "pause")

    async def resume(self, task_id: str) -> Task:
        """A paused task is queued again; its next attempt gets TASKGATE_RESUME=1."""
        rt = self.rt
        domain.validate_task_id(task_id)
        now = rt.clock.now_ms()
        async with rt.locks[task_id]:
            task, stored = await rt.store.update_task(
                task_id, lambda t: domain.resume(t, now), "task.state_changed", now
            )
            rt.published(stored, task)
        rt.wake.set()
        return task

    async def _stop_request(
        self,
        task_id: str,
        cause: str,
        replaced_by: str | None,
        wait_s: float,
        why: str,
        before_stop: Callable[[], Awaitable[None]] | None = None,
    ) -> Task:
        rt = self.rt
        now = rt.clock.now_ms()
        async with rt.locks[task_id]:
            task = await rt.store.get_task(task_id)
            if domain.cancel_is_noop(task) or (why == "pause" and domain.pause_is_noop(task)):
                return task
            cancellation = Cancellation(requested_at=now, cause=cause, replaced_by_task_id=replaced_by)
            if task.state == State.RECOVERING:
                task, stored = await rt.store.update_task(
                    task_id,
                    lambda t: domain.record_cancel_while_recovering(t, cancellation, now),
                    "task.state_changed",
                    now,
                )
                rt.published(stored, task)
                return task
            if not rt.mine(task) and (task.state in domain.ACTIVE or task.state == State.QUEUED):
                # Another host's worker (or claim): only that host may signal it. The request is
                # recorded in the task and that host is woken; it stops with the same proof.
                task, stored = await rt.store.request_stop_elsewhere(task_id, cancellation, why == "pause", now)
                rt.published(stored, task)
                if stored is not None or not rt.mine(task):
                    return task
            live = rt.live.get(task_id)
            if live is None:
                # Not launched by this incarnation: stop what the last attempt recorded
                # (for a queued task: a launch an earlier incarnation did not finish; a
                # paused one was proven stopped already).
                attempts = await rt.store.attempts_of(task_id)
                idle = task.state in (State.QUEUED, State.PAUSED)
                if attempts and (not idle or attempts[-1].state == "launching"):
                    live = LiveAttempt(
                        attempt=attempts[-1],
                        profile=rt.settings.workers.get(task.profile, WorkerProfile(command=["unknown"])),
                    )
            if live is None:
                # Queued, paused or never launched: nothing runs, so nothing to prove.
                def at_once(t: Task) -> Task:
                    if why == "pause":
                        return domain.pause(t, now)
                    return domain.cancel_at_once(t, cancellation, now)

                task, stored = await rt.store.update_task(task_id, at_once, "task.state_changed", now)
                rt.published(stored, task)
                return task
            task, stored = await rt.store.update_task(
                task_id, lambda t: domain.request_cancel(t, cancellation, now), "task.state_changed", now
            )
            rt.published(stored, task)
            live.stopping = True
            verb = "paused" if why == "pause" else f"cancelled ({cause})"
            stopper = rt.spawn(self._stop_after(before_stop, live, why, verb))
        if wait_s > 0:
            done, _ = await asyncio.wait({stopper}, timeout=wait_s)
            if done:
                return await rt.store.get_task(task_id)
        return task

    async def apply_requested_stops(self) -> int:
        """Stop this host's workers whose stop another replica recorded (``cancel_requested``)."""
        rt = self.rt
        started = 0
        for task in await rt.store.tasks_in_states([State.CANCEL_REQUESTED], owner=rt.own):
            live = rt.live.get(task.task_id)
            if live is None or live.process is None:
                continue  # launching (its launch sees the request) or not this incarnation's
            async with rt.locks[task.task_id]:
                if live.stopping or live.exited.is_set():
                    continue
                live.stopping = True
            why = domain.requested_stop(task)
            log.info("applying_requested_stop", task_id=task.task_id, why=why)
            rt.spawn(self.stop_and_settle(live, why, "paused" if why == "pause" else "cancelled on request"))
            started += 1
        return started

    async def _stop_after(
        self, before_stop: Callable[[], Awaitable[None]] | None, live: LiveAttempt, why: str, verb: str
    ) -> Task:
        if before_stop is not None:
            try:
                await before_stop()
            except Exception:  # the task's own stop must still happen
                log.exception("before_stop_failed", task_id=live.attempt.task_id)
        return await self.stop_and_settle(live, why, verb)

    async def retry_cleanup(self, task_id: str) -> Task:
        rt = self.rt
        domain.validate_task_id(task_id)
        async with rt.locks[task_id]:
            task = await rt.store.get_task(task_id)
            if task.state != State.NEEDS_RECONCILIATION:
                return task
            if not rt.mine(task):
                # Its processes are on another host: only that host can look for proof.
                raise domain.InvalidTransition(
                    "TASK_ON_OTHER_HOST",
                    f"task {task_id} is owned by scheduler host {task.owner_host}; retry its cleanup there"
                    " (a host gone for good: `taskgate admin hosts resolve HOST --host-is-gone`)",
                    owner_host=task.owner_host or "",
                )
            attempts = await rt.store.attempts_of(task_id)
        outcome = task.pending_outcome or PendingOutcome(state=State.CANCELLED)
        attempt = attempts[-1] if attempts else None
        if attempt is not None:
            status = await self.stop_tree(attempt)
        async with rt.locks[task_id]:
            if attempt is None or status.gone:
                return await self.settler.settle(task_id, outcome, attempt)
            return await self.settler.unconfirmed(task_id, outcome, attempt, status.describe())
