"""Pure rules: origins, prefixes, clamping at UTF-8 boundaries, entries, question rules."""

from __future__ import annotations

import pytest

from services.pending_registry import domain
from services.pending_registry.domain import (
    AnswerAttempt,
    EntryKind,
    NewAsk,
    NewQuestion,
    QuestionState,
    ToolResult,
)

TASK = "a" * 32
OTHER_TASK = "b" * 32


def reason_of(excinfo: pytest.ExceptionInfo[domain.errors.DomainError]) -> str:
    return excinfo.value.reason


# --- origins and prefixes -------------------------------------------------------


@pytest.mark.parametrize(
    ("session_id", "origin"),
    [("cli-1", "cli-"), ("chat-abc", "chat-"), ("tg-42:7", "tg-"), ("dc-x.y", "dc-"), ("cli-cli-", "cli-")],
)
def test_origin_of_known_prefixes(session_id: str, origin: str) -> None:
    assert domain.origin_of(session_id) == origin


@pytest.mark.parametrize("session_id", ["web-1", "tg-", "cli", "CLI-1", "x", "telegram-1", "chat_1"])
def test_origin_of_unknown_prefix_is_invalid_argument(session_id: str) -> None:
    with pytest.raises(domain.InvalidArgument) as exc:
        domain.origin_of(session_id)
    assert reason_of(exc) == "SESSION_ORIGIN_UNKNOWN"


@pytest.mark.parametrize("session_id", ["", "cli- 1", "cli-" + "x" * 200, "-cli-1", "cli-é"])
def test_origin_of_malformed_session_id(session_id: str) -> None:
    with pytest.raises(domain.InvalidArgument) as exc:
        domain.origin_of(session_id)
    assert reason_of(exc) == "INVALID_ID"


@pytest.mark.parametrize("prefix", ["", "cli-", "chat-", "tg-", "dc-", "tg-chat42-"])
def test_valid_prefixes(prefix: str) -> None:
    assert domain.validate_prefix(prefix) == prefix


@pytest.mark.parametrize("prefix", ["tg", "web-", "c", "tg-a b", "x" * 200])
def test_invalid_prefixes(prefix: str) -> None:
    with pytest.raises(domain.InvalidArgument):
        domain.validate_prefix(prefix)


def test_listener_prefix_matching() -> None:
    assert domain.listener_covers_origin("", "tg-")
    assert domain.listener_covers_origin("tg-", "tg-")
    assert not domain.listener_covers_origin("tg-", "dc-")
    # A narrower listener does not cover the whole origin, only its sessions.
    assert not domain.listener_covers_origin("tg-chat42-", "tg-")
    assert domain.prefix_matches("tg-chat42-", "tg-chat42-s1")
    assert not domain.prefix_matches("tg-chat42-", "tg-chat43-s1")


# --- clamping -----------------------------------------------------------------


def _check_clamp(text: str, limit: int) -> None:
    out, cut = domain.clamp_utf8(text, limit)
    raw = text.encode("utf-8")
    assert text.startswith(out)
    assert len(out.encode("utf-8")) <= limit
    assert cut == (out != text)
    if cut:
        # Maximal: the next character would not have fitted.
        nxt = text[len(out)]
        assert len(out.encode("utf-8")) + len(nxt.encode("utf-8")) > limit
    else:
        assert len(raw) <= limit


@pytest.mark.parametrize("char", ["a", "é", "€", "😀"])
def test_clamp_never_splits_a_character(char: str) -> None:
    text = ("x" + char) * 50
    for limit in range(0, len(text.encode("utf-8")) + 2):
        _check_clamp(text, limit)


def test_clamp_mixed_widths_at_every_cut() -> None:
    text = "aé€😀" * 30 + "z"
    for limit in range(0, len(text.encode("utf-8")) + 1):
        _check_clamp(text, limit)


def test_clamp_snapshot_limits_in_bytes_not_characters() -> None:
    # 4 KiB output of 3-byte characters: 1365 characters fit (4095 bytes), 1366 do not.
    result = domain.clamp_tool_result(ToolResult("c1", "grep", "€" * 1000, "€" * 5000))
    assert result.output == "€" * 1365 and result.output_truncated
    assert len(result.arguments.encode()) == 1023 and result.arguments == "€" * 341
    assert result.arguments_truncated
    exact = domain.clamp_tool_result(ToolResult("c1", "grep", "a" * 1024, "b" * 4096))
    assert exact.arguments == "a" * 1024 and not exact.arguments_truncated
    assert exact.output == "b" * 4096 and not exact.output_truncated


# --- entries and snapshots ------------------------------------------------------


def test_cli_entry_has_no_snapshot_other_origins_do() -> None:
    entry, snap = domain.new_entry(NewAsk("cli-1", EntryKind.ASK, "q?"), now=5)
    assert entry.origin == "cli-" and snap is None and len(entry.entry_id) == 32
    tools = (ToolResult("c1", "read", "{}", "x" * 10_000),)
    entry, snap = domain.new_entry(NewAsk("tg-1", EntryKind.CONFIRM, "ok?", tools, agent_id="agent-1"), now=5)
    assert snap is not None and snap.entry_id == entry.entry_id and snap.kind == EntryKind.CONFIRM
    assert snap.tool_results[0].output == "x" * 4096 and snap.tool_results[0].output_truncated


def test_entry_validation() -> None:
    with pytest.raises(domain.InvalidArgument) as exc:
        domain.new_entry(NewAsk("tg-1", None, "q", agent_id="agent-1"), now=1)
    assert reason_of(exc) == "INVALID_KIND"
    with pytest.raises(domain.InvalidArgument) as exc:
        domain.new_entry(NewAsk("tg-1", EntryKind.ASK, "é" * (32 * 1024 + 1), agent_id="agent-1"), now=1)
    assert reason_of(exc) == "PAYLOAD_TOO_LARGE"
    with pytest.raises(domain.InvalidArgument) as exc:
        domain.new_entry(
            NewAsk("tg-1", EntryKind.ASK, "q", (ToolResult("c", "n", "", ""),) * 257, agent_id="agent-1"), now=1
        )
    assert reason_of(exc) == "TOO_MANY_TOOL_RESULTS"


def test_pick_filter() -> None:
    entry, _ = domain.new_entry(NewAsk("tg-1", EntryKind.SECRET, "", agent_id="agent-1"), now=1)
    assert domain.PickFilter("").accepts(entry)
    assert domain.PickFilter("tg-").accepts(entry)
    assert not domain.PickFilter("dc-").accepts(entry)
    assert domain.PickFilter("", frozenset({EntryKind.SECRET})).accepts(entry)
    assert not domain.PickFilter("", frozenset({EntryKind.ASK})).accepts(entry)
    assert domain.PickFilter("tg-", session_id="tg-1").accepts(entry)
    assert not domain.PickFilter("tg-", session_id="tg-2").accepts(entry)


@pytest.mark.parametrize("cause", ["", "user canceled", "x" * 65, "drop;table"])
def test_invalid_causes(cause: str) -> None:
    with pytest.raises(domain.InvalidArgument):
        domain.validate_cause(cause)


# --- questions ------------------------------------------------------------------


def _question(state: QuestionState = QuestionState.OPEN, answer: str | None = None) -> domain.Question:
    q, _ = domain.ask_question(NewQuestion(TASK, "tg-1", "which branch?"), None, now=10)
    if state == QuestionState.ANSWERED:
        q, _ = domain.answer_question(q, AnswerAttempt(TASK, q.question_id, answer or "main", None), now=11)
    elif state == QuestionState.CANCELLED:
        q = domain.cancel_question(q, 11)
    elif state == QuestionState.REPLACED:
        _, replaced = domain.ask_question(NewQuestion(TASK, "tg-1", "again"), q, now=11)
        assert replaced is not None
        q = replaced
    return q


def test_revisions_and_replacement() -> None:
    first, replaced = domain.ask_question(NewQuestion(TASK, "tg-1", "one"), None, now=1)
    assert first.revision == 1 and replaced is None and first.state == QuestionState.OPEN
    second, replaced = domain.ask_question(NewQuestion(TASK, "tg-1", "two"), first, now=2)
    assert second.revision == 2 and second.question_id != first.question_id
    assert replaced is not None and replaced.state == QuestionState.REPLACED and replaced.closed_at == 2
    # After an answered question nothing is replaced, the revision still counts up.
    answered, _ = domain.answer_question(second, AnswerAttempt(TASK, second.question_id, "x", None), now=3)
    third, replaced = domain.ask_question(NewQuestion(TASK, "tg-1", "three"), answered, now=4)
    assert third.revision == 3 and replaced is None


def test_answer_open_question() -> None:
    q = _question()
    answered, changed = domain.answer_question(q, AnswerAttempt(TASK, q.question_id, "main", "alice"), now=20)
    assert changed and answered.state == QuestionState.ANSWERED
    assert (answered.answer, answered.answered_by, answered.answered_at) == ("main", "alice", 20)


def test_same_answer_again_is_idempotent() -> None:
    q = _question(QuestionState.ANSWERED, "main")
    again, changed = domain.answer_question(q, AnswerAttempt(TASK, q.question_id, "main", "bob"), now=30)
    assert not changed and again == q


def test_different_answer_to_answered_question_is_denied() -> None:
    q = _question(QuestionState.ANSWERED, "main")
    with pytest.raises(domain.PermissionDenied) as exc:
        domain.answer_question(q, AnswerAttempt(TASK, q.question_id, "dev", None), now=30)
    assert reason_of(exc) == "QUESTION_ALREADY_ANSWERED"


@pytest.mark.parametrize("state", [QuestionState.REPLACED, QuestionState.CANCELLED])
def test_stale_question_is_denied(state: QuestionState) -> None:
    q = _question(state)
    assert q.state == state
    with pytest.raises(domain.PermissionDenied) as exc:
        domain.answer_question(q, AnswerAttempt(TASK, q.question_id, "main", None), now=30)
    assert reason_of(exc) == "QUESTION_STALE"


def test_question_of_another_task_is_denied() -> None:
    q = _question()
    with pytest.raises(domain.PermissionDenied) as exc:
        domain.answer_question(q, AnswerAttempt(OTHER_TASK, q.question_id, "main", None), now=30)
    assert reason_of(exc) == "QUESTION_STALE"


@pytest.mark.parametrize(
    ("attempt", "reason"),
    [
        (AnswerAttempt(TASK, "c" * 32, "", None), "ANSWER_EMPTY"),
        (AnswerAttempt(TASK, "c" * 32, "  \n", None), "ANSWER_EMPTY"),
        (AnswerAttempt(TASK, "c" * 32, "x" * (64 * 1024 + 1), None), "ANSWER_TOO_LARGE"),
        (AnswerAttempt("not-a-task", "c" * 32, "x", None), "INVALID_ID"),
        (AnswerAttempt(TASK, "C" * 32, "x", None), "INVALID_ID"),
        (AnswerAttempt(TASK, "c" * 31, "x", None), "INVALID_ID"),
    ],
)
def test_answer_validation(attempt: AnswerAttempt, reason: str) -> None:
    with pytest.raises(domain.InvalidArgument) as exc:
        domain.validate_answer_attempt(attempt)
    assert reason_of(exc) == reason


def test_question_validation() -> None:
    with pytest.raises(domain.InvalidArgument) as exc:
        domain.validate_new_question(NewQuestion(TASK, "tg-1", " "))
    assert reason_of(exc) == "TEXT_EMPTY"
    with pytest.raises(domain.InvalidArgument):
        domain.validate_new_question(NewQuestion("x", "tg-1", "q"))
    with pytest.raises(domain.InvalidArgument):
        domain.validate_new_question(NewQuestion(TASK, "bad id", "q"))
    # Questions are task-scoped: any well-formed session id will do.
    assert domain.validate_new_question(NewQuestion(TASK, "session-7", "q"))
