from __future__ import annotations

from services.scheduler.domain import State, Task
from services.scheduler.events import EventHub


def task(session: str) -> Task:
    return Task(
        task_id="a" * 32,
        agent_id="a",
        session_id=session,
        title="t",
        instructions="",
        profile="p",
        state=State.RUNNING,
        created_at=1,
        updated_at=1,
    )


async def test_watchers_get_only_what_they_accept_and_a_slow_one_is_dropped() -> None:
    hub = EventHub()
    with hub.subscribe(lambda t: t.session_id == "s1") as mine, hub.subscribe(lambda t: True) as slow:
        hub.publish("task.progress", 5, task("s2"))
        hub.publish("task.progress", 6, task("s1"))
        assert mine.queue.qsize() == 1 and (await mine.queue.get()).at == 6
        for i in range(slow.queue.maxsize + 1):
            hub.publish("task.progress", i, task("s1"))
            mine.queue.get_nowait()
        assert slow.overflowed and not mine.overflowed
        assert hub.subscriber_count == 1, "the slow watcher no longer holds memory"
    assert hub.subscriber_count == 0
