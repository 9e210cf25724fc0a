"""Reminder evaluation on the user-message path (the notifier's CreateMessage).

Every user message counts toward each open question of its conversation and may
create a reminder, in the message's own transaction. Measured on the real store
(SQLite, WAL) in-process: a user message with the evaluation off (as before) and with
it on for 0, 1 and 20 open questions (every 3rd message makes each due: cooldown 0),
plus the pure rule alone.

Run: .venv/bin/python bench/bench_reminders.py   (or `make bench`)
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from libs.db import Database  # noqa: E402
from services.notifier import domain  # noqa: E402
from services.notifier.domain import Kind, Message, Notification  # noqa: E402
from services.notifier.store import MIGRATIONS, NotifierStore, QuestionFact, ReminderRow  # noqa: E402

MESSAGES = 300


def reminder(q: ReminderRow, count: int) -> Notification:
    return Notification(
        notification_id=uuid.uuid4().hex,
        agent_id=q.agent_id,
        session_id=q.session_id,
        kind=Kind.REMINDER,
        task_id=q.task_id,
        question_id=q.question_id,
        text="r",
        created_at=int(time.time() * 1000),
        key=f"{q.question_id}:reminder:{count}",
    )


async def run(store: NotifierStore, session: str, questions: int, evaluate: bool) -> list[float]:
    for i in range(questions):
        q = QuestionFact(uuid.uuid4().hex, "a", session, f"t{i}", "title", "which?", 0)
        await store.record_log_event("bench", i + 1, None, uuid.uuid4().hex, question=q)
    times = []
    for _ in range(MESSAGES):
        m = Message(
            message_id=uuid.uuid4().hex,
            agent_id="a",
            session_id=session,
            role="user",
            text="hi",
            created_at=int(time.time() * 1000),
        )
        start = time.perf_counter()
        await store.add_user_message(m, 0, reminder if evaluate else None)
        times.append((time.perf_counter() - start) * 1000)
    return times


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        db = Database(f"sqlite:///{Path(tmp) / 'n.db'}", MIGRATIONS)
        db.migrate()
        store = NotifierStore(db)
        print(f"user message → stored (+ reminders), {MESSAGES} messages each, SQLite:")
        for label, questions, evaluate in [
            ("evaluation off", 0, False),
            ("0 open questions", 0, True),
            ("1 open question", 1, True),
            ("20 open questions", 20, True),
        ]:
            times = await run(store, f"s-{label.replace(' ', '-')}", questions, evaluate)
            p99 = sorted(times)[int(0.99 * len(times))]
            print(f"  {label:18s} p50 {statistics.median(times):6.3f} ms   p99 {p99:6.3f} ms")
        db.close()
    q = domain.QuestionReminders(asked_at=0)
    n = 200_000
    start = time.perf_counter()
    for i in range(n):
        q, _ = domain.after_user_message(q, i, 600_000)
    print(f"pure rule (after_user_message): {(time.perf_counter() - start) / n * 1e6:.2f} µs per call")


if __name__ == "__main__":
    asyncio.run(main())
