"""Question reminder, snooze and mute rules: pure, with the clock passed in."""

from __future__ import annotations

from services.notifier import domain
from services.notifier.domain import QuestionReminders, QuestionState

BASE = 600_000


def feed(q: QuestionReminders, times: list[int]) -> tuple[QuestionReminders, list[int]]:
    """Apply one user message at each time; the times at which a reminder went out."""
    sent: list[int] = []
    for t in times:
        q, due = domain.after_user_message(q, t, BASE)
        if due:
            sent.append(t)
    return q, sent


def test_three_messages_and_the_first_cooldown_make_a_reminder() -> None:
    q = QuestionReminders(asked_at=0)
    # Three messages, but before the cooldown: nothing; the fourth after it reminds.
    q, sent = feed(q, [1, 2, 3])
    assert sent == [] and q.messages_since == 3
    q, sent = feed(q, [BASE])
    assert sent == [BASE] and q.reminders_sent == 1 and q.messages_since == 0 and q.last_reminded_at == BASE


def test_cooldown_passed_but_fewer_than_three_messages_is_not_due() -> None:
    q, sent = feed(QuestionReminders(asked_at=0), [10 * BASE, 11 * BASE])
    assert sent == []
    q, sent = feed(q, [12 * BASE])
    assert sent == [12 * BASE]


def test_cooldowns_grow_one_three_then_six_times() -> None:
    assert [domain.reminder_cooldown_ms(n, BASE) for n in range(5)] == [BASE, 3 * BASE, 6 * BASE, 6 * BASE, 6 * BASE]
    q, sent = feed(QuestionReminders(asked_at=0), [1, 2, BASE])
    assert sent == [BASE]
    # Second reminder: 3 messages and 3x the base after the first.
    q, sent = feed(q, [BASE + 1, BASE + 2, BASE + 3 * BASE - 1])
    assert sent == []
    q, sent = feed(q, [4 * BASE])
    assert sent == [4 * BASE] and q.reminders_sent == 2
    # Third: 6x.
    q, sent = feed(q, [4 * BASE + 1, 4 * BASE + 2, 10 * BASE - 1])
    assert sent == []
    q, sent = feed(q, [10 * BASE])
    assert sent == [10 * BASE] and q.reminders_sent == 3


def test_snooze_defers_one_hour_then_reminds_again() -> None:
    q = domain.snooze(QuestionReminders(asked_at=0), now_ms=0)
    assert q.snoozed_until == domain.SNOOZE_MS
    q, sent = feed(q, [BASE, BASE + 1, BASE + 2, domain.SNOOZE_MS - 1])
    assert sent == []
    q, sent = feed(q, [domain.SNOOZE_MS])
    assert sent == [domain.SNOOZE_MS]


def test_mute_answered_and_replaced_never_remind() -> None:
    for q in (
        domain.mute(QuestionReminders(asked_at=0)),
        QuestionReminders(asked_at=0, state=QuestionState.ANSWERED),
        QuestionReminders(asked_at=0, state=QuestionState.REPLACED),
    ):
        _, sent = feed(q, [BASE * k for k in range(1, 20)])
        assert sent == []


def test_what_a_task_state_does_to_its_question() -> None:
    assert domain.question_fate("waiting_input") is None
    assert domain.question_fate("paused") is None  # pause keeps the question
    assert domain.question_fate("running") == QuestionState.ANSWERED
    assert domain.question_fate("cancelled") == QuestionState.CLOSED
    assert domain.question_fate("completed") == QuestionState.CLOSED


def test_question_text_says_how_to_answer_and_what_it_replaces() -> None:
    qid = "a" * 32
    text = domain.question_text("Build", "Which DB?", qid)
    assert "Which DB?" in text and f"/task_question {qid} answer <text>" in text and "replaces" not in text
    assert f"replaces question {'b' * 32}" in domain.question_text("Build", "Which DB?", qid, replaces="b" * 32)
