"""Gateway-managed tasks: a request to an external agent session instead of a worker process.

No process, no worker-pool slot, no fake turns or token figures: the task's attempt tracks the
request — ``dispatched`` (committed before the POST, so a crash after sending is never taken for
"not sent"), ``acknowledged`` (the target answered 2xx), then ``answered`` / ``failed`` from the
target's outcome, or ``outcome_unknown``. The one adapter is ``http``: the scheduler POSTs the
request, signed like webhooks (``X-Taskgate-Signature: sha256=<HMAC-SHA256(secret, body)>``), and
the target reports the outcome to the gateway (``POST /api/v1/dispatch/{requestId}/outcome``,
signed the same way), which relays it here (``RecordDispatchOutcome``).

Never retried: a request that may have reached the target but whose answer was lost (a read
timeout, a dropped connection, no outcome within ``outcome_timeout_ms``) ends ``failed``
``DISPATCH_OUTCOME_UNKNOWN`` (retryable: false). Only a request that provably never left (the
connection was refused) or that the target refused is ``DISPATCH_FAILED``.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import secrets
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import structlog

from libs import errors
from libs.settings import TargetConfig
from services.scheduler import domain
from services.scheduler.domain import Attempt, Cancellation, Failure, PendingOutcome, State, Task
from services.scheduler.runtime import Runtime, hash_token
from services.scheduler.settling import Settler

log = structlog.get_logger("scheduler")

LIVE = (State.RUNNING, State.WAITING_INPUT)
OUTCOMES = ("acknowledged", "question", "answered", "failed")
ANSWER_POLL_S = 25.0


def signature(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


class OutcomeRefused(errors.Unauthenticated):
    pass


class TargetDispatcher:
    def __init__(self, rt: Runtime, settler: Settler) -> None:
        self.rt = rt
        self.settler = settler
        self._polled: dict[str, int] = {}  # task id -> when its target was last asked
        self._cancelling: set[str] = set()  # cancels being told to their target right now
        self._relaying: set[str] = set()  # tasks whose question's answer is awaited for the target
        self._relays: set[asyncio.Task[None]] = set()

    def _target(self, task: Task) -> TargetConfig | None:
        return self.rt.settings.targets.get(task.gateway_target.name) if task.gateway_target else None

    # --- dispatch (the dispatcher calls it, under the task's lock) ---------------------

    async def dispatch(self, task: Task, previous: list[Attempt]) -> bool:
        rt = self.rt
        target = self._target(task)
        cleared = task.gateway_target is not None and task.gateway_target.safemode_cleared
        if target is None or (target.safemode and not cleared):
            why = "is no longer configured" if target is None else "was put in safemode after the task was created"
            await self.settler.finish(task.task_id, State.FAILED, domain.dispatch_failed(f"the target {why}", False))
            return False
        now = rt.clock.now_ms()
        attempt = Attempt(
            attempt_id=uuid.uuid4().hex,
            task_id=task.task_id,
            number=len(previous) + 1,
            boot_id=rt.boot_id,
            # Unique like a worker's; no worker ever holds it.
            token_hash=hash_token(secrets.token_urlsafe(32)),
            started_at=now,
            state="dispatched",
            outcome="dispatched",
        )
        task, stored = await rt.store.update_task(
            task.task_id, lambda t: domain.dispatched(t, now), "task.state_changed", now, attempt=attempt
        )
        rt.published(stored, task)
        log.info(
            "request_dispatched", task_id=task.task_id, target=task.gateway_target.name if task.gateway_target else ""
        )
        rt.spawn(self._post(task, attempt, target), f"dispatch-{task.task_id}")
        return True

    def _request_body(self, task: Task) -> bytes:
        t = task.gateway_target
        assert t is not None and task.gateway_dispatch is not None
        request_id = task.gateway_dispatch.request_id
        return json.dumps(
            {
                "requestId": request_id,
                "taskId": task.task_id,
                "agentId": task.agent_id,
                "sessionId": task.session_id,
                "title": task.title,
                "instructions": task.instructions,
                "nativeSessionId": t.native_session_id,
                "displayName": t.display_name,
                "options": t.options,
                "outcomeUrl": f"http://{self.rt.settings.http_addr}/api/v1/dispatch/{request_id}/outcome",
            }
        ).encode()

    async def _send(self, target: TargetConfig, body: bytes, event: str, request_id: str) -> httpx.Response:
        headers = {
            "Content-Type": "application/json",
            "X-Taskgate-Signature": signature(target.secret, body),
            "X-Taskgate-Event": event,
            "Idempotency-Key": f"{request_id}:{event}",
        }
        async with httpx.AsyncClient(timeout=target.dispatch_timeout_ms / 1000) as client:
            return await client.post(target.url, content=body, headers=headers)

    async def _post(self, task: Task, attempt: Attempt, target: TargetConfig) -> None:
        assert task.gateway_dispatch is not None
        try:
            response = await self._send(target, self._request_body(task), "dispatch", task.gateway_dispatch.request_id)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            # Nothing left this host: the target was not reached.
            await self._end(
                task.task_id,
                attempt,
                "failed",
                State.FAILED,
                domain.dispatch_failed(f"the target could not be reached: {type(exc).__name__}", True),
            )
            return
        except httpx.HTTPError as exc:
            # Sent, or partly sent: whether the target acted on it is unknown. Never retried.
            log.warning("dispatch_outcome_unknown", task_id=task.task_id, error=type(exc).__name__)
            await self._end(
                task.task_id,
                attempt,
                "outcome_unknown",
                State.FAILED,
                domain.dispatch_outcome_unknown(f"{type(exc).__name__} while waiting for the answer"),
            )
            return
        if not response.is_success:
            retryable = response.status_code >= 500 or response.status_code == 429
            await self._end(
                task.task_id,
                attempt,
                "failed",
                State.FAILED,
                domain.dispatch_failed(f"the target refused the request: HTTP {response.status_code}", retryable),
            )
            return
        await self._acknowledged(task.task_id, attempt)
        try:
            doc = response.json()
        except ValueError:
            return
        if isinstance(doc, dict) and doc.get("status") in ("answered", "failed"):
            await self._apply_outcome(task.task_id, doc)  # the answer came with the acknowledgement

    async def _acknowledged(self, task_id: str, attempt: Attempt) -> None:
        async with self.rt.locks[task_id]:
            current = await self.rt.store.attempts_of(task_id)
            if current and current[-1].attempt_id == attempt.attempt_id and current[-1].state == "dispatched":
                latest = current[-1]
                latest.state = latest.outcome = "acknowledged"
                await self.rt.store.save_attempt(latest)

    async def _end(
        self,
        task_id: str,
        attempt: Attempt | None,
        outcome: str,
        state: State,
        failure: Failure | None,
        result: domain.Result | None = None,
    ) -> Task:
        async with self.rt.locks[task_id]:
            attempts = await self.rt.store.attempts_of(task_id)
            latest = attempt
            if attempts and (attempt is None or attempts[-1].attempt_id == attempt.attempt_id):
                latest = attempts[-1]
            if latest is not None:
                latest.state, latest.outcome = "ended", outcome
                latest.ended_at = latest.ended_at or self.rt.clock.now_ms()
            return await self.settler.finish(task_id, state, failure, result=result, attempt=latest, only_from=LIVE)

    # --- the target's outcome (relayed by the gateway) -----------------------------------

    async def record_outcome(self, request_id: str, body: bytes, sig: str) -> Task:
        domain.validate_task_id(request_id)
        task = await self.rt.store.find_task(request_id)
        target = self._target(task) if task is not None and task.gateway_managed else None
        # One answer for an unknown request and a bad signature: nothing to learn by probing.
        if task is None or target is None or not hmac.compare_digest(sig, signature(target.secret, body)):
            raise OutcomeRefused("BAD_SIGNATURE", "unknown request or bad X-Taskgate-Signature")
        try:
            doc = json.loads(body)
        except ValueError:
            raise domain.InvalidArgument("INVALID_JSON", "the outcome is not JSON") from None
        if not isinstance(doc, dict) or doc.get("status") not in OUTCOMES:
            raise domain.InvalidArgument("INVALID_OUTCOME", "status must be acknowledged, question, answered or failed")
        for name in ("text", "error"):
            if name in doc and not isinstance(doc[name], str):
                raise domain.InvalidArgument("INVALID_OUTCOME", f"{name} must be a string")
        return await self._apply_outcome(task.task_id, doc)

    async def _apply_outcome(self, task_id: str, doc: dict[str, Any]) -> Task:
        attempts = await self.rt.store.attempts_of(task_id)
        task = await self.rt.store.get_task(task_id)
        if not attempts or task.state not in LIVE:
            return task  # already ended: an outcome repeated or too late changes nothing
        attempt = attempts[-1]
        if doc["status"] == "acknowledged":
            await self._acknowledged(task_id, attempt)
            return await self.rt.store.get_task(task_id)
        if doc["status"] == "question":
            return await self._ask(task, str(doc.get("text", "")))
        if doc["status"] == "answered":
            text = domain.clamp_utf8(str(doc.get("text", "")), domain.MAX_OUTCOME_TEXT_BYTES)
            log.info("dispatch_answered", task_id=task_id)
            return await self._end(task_id, attempt, "answered", State.COMPLETED, None, domain.Result(text=text))
        error = domain.clamp_utf8(str(doc.get("error") or "the target reported a failure"), 2000)
        log.info("dispatch_failed", task_id=task_id)
        return await self._end(task_id, attempt, "failed", State.FAILED, domain.dispatch_failed(error, False))

    # --- questions from the target ------------------------------------------------------

    async def _ask(self, task: Task, text: str) -> Task:
        """The target asks the task's humans (outcome ``question``): the task waits for input as a
        worker's would; the answer, once saved, is POSTed to the target (event ``answer``)."""
        rt = self.rt
        domain.validate_question(text)
        if rt.questions is None:
            raise errors.Unavailable("PENDING_REGISTRY_UNAVAILABLE", "no pending-registry is configured")
        if task.state == State.WAITING_INPUT and task.pending_question and task.pending_question.text == text:
            return task  # the same question again
        domain.check_can_ask(task)
        task = await rt.store.mark_may_have_asked(task, rt.clock.now_ms())
        request_id = f"{task.task_id}-{hashlib.sha256(text.encode()).hexdigest()[:24]}"
        question = await rt.questions.ask(task.task_id, task.session_id, text, request_id)
        pending = domain.PendingQuestion(question_id=question.question_id, text=text, revision=question.revision)
        now = rt.clock.now_ms()
        task, stored = await rt.store.update_task(
            task.task_id, lambda t: domain.wait_for_input(t, pending, now), "task.question", now
        )
        rt.published(stored, task)
        self._relay_later(task.task_id)
        return task

    def _relay_later(self, task_id: str) -> None:
        # Not a runtime background task: a long poll must not hold up shutdown (``close``).
        if task_id not in self._relaying and not self.rt.closing:
            self._relaying.add(task_id)
            relay = asyncio.create_task(self._relay_answer(task_id), name=f"answer-{task_id}")
            self._relays.add(relay)
            relay.add_done_callback(self._relays.discard)

    async def close(self) -> None:
        """Shutdown: stop waiting for answers (a restart resumes the relays from the database)."""
        for relay in list(self._relays):
            relay.cancel()
        await asyncio.gather(*self._relays, return_exceptions=True)

    async def _relay_answer(self, task_id: str) -> None:
        """Wait for the saved answer, hand it to the target, then the task runs again. A failed
        hand-over is retried (1 s doubling to 30 s) while the task still waits."""
        rt = self.rt
        backoff = 1.0
        try:
            while not rt.closing and rt.questions is not None:
                task = await rt.store.get_task(task_id)
                question = task.pending_question
                target = self._target(task)
                if task.state != State.WAITING_INPUT or question is None or target is None:
                    return
                saved = await rt.questions.await_answer(question.question_id, ANSWER_POLL_S)
                if saved is None:
                    continue
                if not saved.answer:
                    return  # closed without an answer (the task was cancelled)
                assert task.gateway_dispatch is not None
                body = json.dumps(
                    {
                        "requestId": task.gateway_dispatch.request_id,
                        "questionId": question.question_id,
                        "answer": str(saved.answer),
                    }
                ).encode()
                try:
                    response = await self._send(target, body, "answer", task.gateway_dispatch.request_id)
                    delivered = response.is_success
                except httpx.HTTPError:
                    delivered = False
                if not delivered:
                    log.warning("answer_not_delivered", task_id=task_id)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 30.0)
                    continue
                now = rt.clock.now_ms()

                def change(t: Task, qid: str = question.question_id, at: int = now) -> Task | None:
                    return t if domain.answer_delivered(t, qid, at) else None

                async with rt.locks[task_id]:
                    task, stored = await rt.store.update_task(task_id, change, "task.state_changed", now)
                rt.published(stored, task)
                return
        except Exception:  # the deadline loop starts another relay on its next pass
            log.exception("answer_relay_failed", task_id=task_id)
        finally:
            self._relaying.discard(task_id)

    # --- cancel ----------------------------------------------------------------------

    async def cancel(self, task_id: str, cause: str, replaced_by: str | None) -> Task:
        """Queued: cancelled at once. Dispatched: the target is told; ``cancelled`` once it
        acknowledges (2xx), else ``needs_reconciliation`` (``retry-cleanup`` tells it again)."""
        rt = self.rt
        now = rt.clock.now_ms()
        cancellation = Cancellation(
            requested_at=now, cause=domain.validate_cause(cause), replaced_by_task_id=replaced_by
        )
        async with rt.locks[task_id]:
            task = await rt.store.get_task(task_id)
            if domain.cancel_is_noop(task):
                return task
            if task.state in (State.QUEUED, State.PAUSED):
                task, stored = await rt.store.update_task(
                    task_id, lambda t: domain.cancel_at_once(t, cancellation, now), "task.state_changed", now
                )
                rt.published(stored, task)
                return task
            self._cancelling.add(task_id)  # before the commit: the deadline loop must not tell it too
            try:
                task, stored = await rt.store.update_task(
                    task_id, lambda t: domain.request_cancel(t, cancellation, now), "task.state_changed", now
                )
            except BaseException:
                self._cancelling.discard(task_id)
                raise
            rt.published(stored, task)
        try:
            return await self._tell_cancel(task_id, PendingOutcome(state=State.CANCELLED))
        finally:
            self._cancelling.discard(task_id)

    async def retry_cleanup(self, task_id: str) -> Task:
        task = await self.rt.store.get_task(task_id)
        if task.state != State.NEEDS_RECONCILIATION:
            return task
        return await self._tell_cancel(task_id, task.pending_outcome or PendingOutcome(state=State.CANCELLED))

    async def _tell_cancel(self, task_id: str, outcome: PendingOutcome) -> Task:
        task = await self.rt.store.get_task(task_id)
        target = self._target(task)
        attempts = await self.rt.store.attempts_of(task_id)
        attempt = attempts[-1] if attempts else None
        detail = "the target is no longer configured"
        if target is not None and task.gateway_dispatch is not None:
            body = json.dumps({"requestId": task.gateway_dispatch.request_id, "cancel": True}).encode()
            try:
                response = await self._send(target, body, "cancel", task.gateway_dispatch.request_id)
                detail = (
                    "" if response.is_success else f"the target answered the cancel with HTTP {response.status_code}"
                )
            except httpx.HTTPError as exc:
                detail = f"the target did not acknowledge the cancel ({type(exc).__name__})"
        async with self.rt.locks[task_id]:
            if attempt is not None:
                attempt.state = "ended"
                attempt.ended_at = attempt.ended_at or self.rt.clock.now_ms()
                attempt.outcome = "cancelled" if not detail else "cancel_unconfirmed"
            if not detail:
                return await self.settler.settle(task_id, outcome, attempt)
            log.warning("cancel_unconfirmed", task_id=task_id, detail=detail)
            return await self.settler.unconfirmed(task_id, outcome, attempt, detail)  # type: ignore[arg-type]

    # --- the outcome deadline (one loop for every dispatched request) ---------------------

    async def overdue_once(self) -> int:
        rt = self.rt
        now = rt.clock.now_ms()
        ended = 0
        for task in await rt.store.tasks_in_states([*LIVE, State.CANCEL_REQUESTED]):
            if task.gateway_managed and task.state == State.CANCEL_REQUESTED:
                if task.task_id not in self._cancelling:
                    # A cancel an earlier incarnation (or a failed attempt) did not finish telling.
                    self._cancelling.add(task.task_id)
                    rt.spawn(self._resume_cancel(task.task_id), f"cancel-{task.task_id}")
                continue
            target = self._target(task)
            timeout = target.outcome_timeout_ms if target else 0
            if not task.gateway_managed:
                continue
            if task.state == State.WAITING_INPUT:
                self._relay_later(task.task_id)  # e.g. after a restart: the answer still reaches the target
                continue
            if not domain.outcome_overdue(task, timeout, now):
                if target is not None and target.poll_interval_ms:
                    await self._poll(task, target, now)
                continue
            await self._end(
                task.task_id,
                None,
                "outcome_unknown",
                State.FAILED,
                domain.dispatch_outcome_unknown(f"no outcome within {timeout} ms"),
            )
            ended += 1
        return ended

    async def _resume_cancel(self, task_id: str) -> None:
        try:
            await self._tell_cancel(task_id, PendingOutcome(state=State.CANCELLED))
        except Exception:  # looked at again on the next pass
            log.exception("cancel_resume_failed", task_id=task_id)
        finally:
            self._cancelling.discard(task_id)

    async def _poll(self, task: Task, target: TargetConfig, now: int) -> None:
        """Ask the target for the outcome (``GET <url>/<requestId>``, the request id signed).

        A read: an error or a 404 only means "ask again later"; a JSON ``{"status": …}`` is
        applied as if it had come through the callback.
        """
        if task.gateway_dispatch is None or now - self._polled.get(task.task_id, 0) < target.poll_interval_ms:
            return
        self._polled[task.task_id] = now
        request_id = task.gateway_dispatch.request_id
        headers = {"X-Taskgate-Signature": signature(target.secret, request_id.encode())}
        try:
            async with httpx.AsyncClient(timeout=target.dispatch_timeout_ms / 1000) as client:
                response = await client.get(f"{target.url.rstrip('/')}/{request_id}", headers=headers)
            doc = response.json() if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return
        if isinstance(doc, dict) and doc.get("status") in OUTCOMES:
            for name in ("text", "error"):
                if name in doc and not isinstance(doc[name], str):
                    return
            await self._apply_outcome(task.task_id, doc)
            if doc["status"] != "acknowledged":
                self._polled.pop(task.task_id, None)

    async def loop(self, closing: Callable[[], bool]) -> None:
        interval = max(self.rt.tasks_cfg.supervisor_interval_ms, 1000) / 1000
        while not closing():
            try:
                await self.overdue_once()
            except Exception:  # keep looking; the error is logged
                log.exception("dispatch_deadline_failed")
            await asyncio.sleep(interval)
