"""The web dashboard in a real browser (headless Chromium from the Debian package, driven by
Playwright) against the five real processes: a bad key is refused, a signed-in person sees a
task appear and change state live (no reload), answers its question and sees it resume,
cancels a task and sees ``cancelled``, and sees the API's 403 message when the key may not act.

Screenshots of the main pages go to the test's output folder (and to
``$TASKGATE_DASHBOARD_SHOTS`` when set: ``docs/dashboard`` is made that way).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import Api, add_member, create_key, run_cli
from tests.support.stack import Stack

CHROMIUM = Path("/usr/bin/chromium")
playwright_api = pytest.importorskip("playwright.sync_api", reason="playwright is a dev dependency (requirements.lock)")
expect = playwright_api.expect
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs the Debian package chromium (apt-get install chromium)"),
]

AGENT = "agent-1"
SESSION = "web-dash"
TIMEOUT_MS = 20_000


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("dashboard-shots")


def save(page: Any, shots: Path, name: str) -> None:
    path = shots / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    extra = os.environ.get("TASKGATE_DASHBOARD_SHOTS")
    if extra:
        Path(extra).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(extra) / path.name)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with playwright_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def person(stack: Stack) -> Api:
    key = create_key(stack, "dana", AGENT)
    add_member(stack, AGENT, SESSION, "dana")
    return Api(stack, key, AGENT, SESSION)


@pytest.fixture
def page(browser: Any, stack: Stack) -> Iterator[Any]:
    context = browser.new_context(base_url=stack.http_url, viewport={"width": 1200, "height": 900})
    context.set_default_timeout(TIMEOUT_MS)
    tab = context.new_page()
    problems: list[str] = []
    tab.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
    tab.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    yield tab
    context.close()
    # A refused request logs a console error by itself (the bad-key test); anything else is a bug.
    unexpected = [p for p in problems if "401" not in p and "403" not in p]
    assert not unexpected, unexpected


def sign_in(page: Any, key: str) -> None:
    page.goto("/")
    page.get_by_label("API key").fill(key)
    page.get_by_role("button", name="Sign in").click()
    page.get_by_role("heading", name="Sessions").wait_for()


def row_state(page: Any, task_id: str) -> Any:
    return page.locator(f'[data-task-id="{task_id}"] [data-state]')


def expect_state(locator: Any, *states: str) -> None:
    # Locator assertions poll without eval(): the page's CSP forbids it (wait_for_function needs it).
    expect(locator).to_have_attribute("data-state", re.compile("^(" + "|".join(states) + ")$"), timeout=TIMEOUT_MS)


def wait_text(page: Any, selector: str, text: str | re.Pattern[str]) -> None:
    expect(page.locator(selector)).to_contain_text(text, timeout=TIMEOUT_MS)


def test_a_bad_key_is_refused_and_nothing_is_kept(page: Any, stack: Stack, shots: Path) -> None:
    response = httpx.get(stack.http_url + "/", timeout=10)
    assert "script-src 'self'" in response.headers["content-security-policy"]
    page.goto("/")
    page.get_by_role("heading", name="Sign in").wait_for()
    page.get_by_label("API key").fill("not-a-key")
    page.get_by_role("button", name="Sign in").click()
    wait_text(page, "#signin-error", "unknown or revoked API key")
    assert page.evaluate("sessionStorage.length") == 0 and page.evaluate("document.cookie") == ""
    save(page, shots, "signin-refused")


def test_a_task_appears_and_changes_state_live(page: Any, person: Api, shots: Path) -> None:
    sign_in(page, person.key)
    assert page.evaluate("Object.keys(sessionStorage)") == ["taskgate.apiKey"]
    save(page, shots, "sessions")
    page.get_by_role("link", name=SESSION).click()
    page.get_by_role("heading", name="Tasks").wait_for()
    expect(page.locator(".live")).to_have_attribute("data-live", "on", timeout=TIMEOUT_MS)
    page.evaluate("window.__sameDocument = true")  # gone if anything reloads the page
    steps = [
        {"progress": "warming up"},
        {"tool": {"name": "bash", "status": "error", "exit_code": 2}},
        {"print": "building the thing"},
        {"burn": 1.0},
        {"sleep": 2.0},  # time to see it running, even on a busy machine
        {"result": {"text": "all done"}},
    ]
    task = person.create("live task", profile="behave", instructions=json.dumps(steps))
    state = row_state(page, task["taskId"])
    state.wait_for()
    expect_state(state, "queued", "running")
    wait_text(page, f'[data-task-id="{task["taskId"]}"]', "bash · error (exit 2)")
    save(page, shots, "tasks-live")
    expect_state(state, "completed")
    assert page.evaluate("window.__sameDocument") is True
    # The task page: result, attempts, log tail and the sparkline from the stream's observations.
    page.get_by_role("link", name="live task").click()
    page.get_by_role("heading", name="live task").wait_for()
    wait_text(page, "#result-text", "all done")
    wait_text(page, "#log-text", "building the thing")
    page.locator("table.attempts tbody tr").first.wait_for()
    assert page.locator("table.attempts tbody tr").count() == 1
    save(page, shots, "task-completed")
    # Phone width: one column, nothing cut off sideways.
    page.set_viewport_size({"width": 390, "height": 844})
    page.go_back()
    page.get_by_role("heading", name="Tasks").wait_for()
    page.get_by_label("All").check()
    row_state(page, task["taskId"]).wait_for()
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")
    save(page, shots, "tasks-phone")


def test_answering_the_question_resumes_the_task(page: Any, person: Api, shots: Path) -> None:
    steps = [
        {"progress": "need a decision"},
        {"ask": "Which database?"},
        {"sleep": 1.5},
        {"result": {"text": "used it"}},
    ]
    task = person.create("asks a question", profile="behave", instructions=json.dumps(steps))
    person.wait_state(task["taskId"], "waiting_input")
    sign_in(page, person.key)
    page.goto(f"/#/a/{AGENT}/s/{SESSION}/t/{task['taskId']}")
    page.get_by_role("heading", name="asks a question").wait_for()
    wait_text(page, "#question-text", "Which database?")
    save(page, shots, "task-question")
    # Keyboard only: focus the answer box, type, submit with Enter on the button.
    page.locator("#answer-text").focus()
    page.keyboard.type("Postgres")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.id") == "answer-send"
    page.keyboard.press("Enter")
    title_state = page.locator(".heading [data-state]")
    expect_state(title_state, "running", "completed")  # resumed: the worker has the answer
    expect(page.locator("#question-text")).to_have_count(0)
    expect_state(title_state, "completed")
    assert person.get(task["taskId"])["progress"]["text"] == "answer: Postgres"


def test_the_list_and_the_task_page_follow_a_task_live(page: Any, person: Api, shots: Path) -> None:
    # The list follows the session's slim stream and reads a row's detail (question text, last
    # tool) when an event says it moved; the task page follows the task's own full stream.
    urls: list[str] = []
    page.on("request", lambda r: urls.append(r.url))
    sign_in(page, person.key)
    page.goto(f"/#/a/{AGENT}/s/{SESSION}")
    expect(page.locator(".live")).to_have_attribute("data-live", "on", timeout=TIMEOUT_MS)
    steps = [
        {"tool": {"name": "pytest", "status": "returned"}},
        {"ask": "Ship it?"},
        {"tool": {"name": "deploy", "status": "returned"}},
        {"burn": 1.0},
        {"sleep": 1.0},
        {"result": {"text": "shipped"}},
    ]
    task = person.create("ships when told", profile="behave", instructions=json.dumps(steps))
    row = f'[data-task-id="{task["taskId"]}"]'
    wait_text(page, row, "Ship it?")
    wait_text(page, row, "pytest · returned")
    expect_state(row_state(page, task["taskId"]), "waiting_input")
    page.evaluate("window.__sameDocument = true")
    page.get_by_role("link", name="ships when told").click()
    page.get_by_role("heading", name="ships when told").wait_for()
    wait_text(page, "#question-text", "Ship it?")
    # Observations arrive while the worker waits (the stack samples every 200 ms).
    page.locator("#sparklines").wait_for()
    expect(page.locator(".heading .live")).to_have_attribute("data-live", "on")
    wait_text(page, "main", re.compile(r"([6-9]|\d\d+) observations since"))  # a line worth a screenshot
    save(page, shots, "task-live")
    page.locator("#answer-text").fill("yes")
    page.get_by_role("button", name="Send answer").click()
    wait_text(page, "main", "deploy · returned")  # the last tool, live
    expect_state(page.locator(".heading [data-state]"), "completed")
    wait_text(page, "#result-text", "shipped")
    expect(page.locator("table.attempts tbody tr")).to_have_count(1)
    expect(page.locator(".heading .live")).to_have_attribute("data-live", "off")  # the stream ended with the task
    assert page.evaluate("window.__sameDocument") is True
    task_stream = f"/api/v1/agents/{AGENT}/sessions/{SESSION}/tasks/{task['taskId']}/events"
    assert any(u.endswith(task_stream) for u in urls), "the task page follows the task's own stream"


def test_the_conversation_shows_response_snapshots_live_and_the_history(page: Any, person: Api, shots: Path) -> None:
    assert person.request("POST", "/messages", json={"text": "please summarise the build"}).status_code == 201
    sign_in(page, person.key)
    page.goto(f"/#/a/{AGENT}/s/{SESSION}/conversation")
    wait_text(page, "#messages", "please summarise the build")
    wait_text(page, "#activity-state", "live")
    put = person.request("PUT", "/responses/resp-1", json={"text": "The build is", "final": False})
    assert put.status_code == 200, put.text
    wait_text(page, '[data-response-id="resp-1"]', "writing…")
    person.request("PUT", "/responses/resp-1", json={"text": "The build is green.", "final": True})
    wait_text(page, '[data-response-id="resp-1"]', "The build is green.")  # replaced, not appended
    assert page.locator('[data-response-id="resp-1"] .text').inner_text() == "The build is green."
    wait_text(page, "#messages", "The build is green.")  # the history, read again once final
    save(page, shots, "conversation")


def test_evidence_and_sub_tasks_render_when_present_and_worker_text_stays_text(
    page: Any, person: Api, shots: Path
) -> None:
    # Tasks do not carry evidence or sub-tasks yet: the browser gets a snapshot that has them
    # (the real one, plus those fields and a title a hostile worker could have chosen).
    task = person.create("<img src=x onerror=window.__owned=1>", profile="exit-at-once")
    snapshot = person.wait_state(task["taskId"], "completed")
    snapshot["evidence"] = {"skills": ["review"], "subagents": ["critic"], "subagentModels": ["model-x"]}
    child = "c" * 32
    snapshot["subagents"] = [{"taskId": child, "title": "check the tests", "state": "completed"}]
    url = f"**/api/v1/agents/{AGENT}/sessions/{SESSION}/tasks/{task['taskId']}"
    page.route(url, lambda route: route.fulfill(json={"task": snapshot}))
    # The task page's own stream too: its snapshot replaces what the GET gave.
    sse = f"event: task.snapshot\nid: 0\ndata: {json.dumps({'task': snapshot})}\n\n"
    page.route(url + "/events", lambda route: route.fulfill(body=sse, content_type="text/event-stream"))
    sign_in(page, person.key)
    page.goto(f"/#/a/{AGENT}/s/{SESSION}/t/{task['taskId']}")
    page.get_by_role("heading", name="<img src=x onerror=window.__owned=1>").wait_for()
    wait_text(page, "main", "Evidence")
    wait_text(page, "main", "model-x")
    expect(page.get_by_role("link", name="check the tests · completed")).to_have_attribute(
        "href", f"#/a/{AGENT}/s/{SESSION}/t/{child}"
    )
    assert page.evaluate("window.__owned === undefined") and page.locator("main img").count() == 0


def test_cancel_asks_for_confirmation_and_ends_cancelled(page: Any, person: Api, shots: Path) -> None:
    task = person.create("long runner", profile="behave", instructions=json.dumps([{"sleep": 120}]))
    person.wait_state(task["taskId"], "running")
    sign_in(page, person.key)
    page.goto(f"/#/a/{AGENT}/s/{SESSION}/t/{task['taskId']}")
    page.get_by_role("heading", name="long runner").wait_for()
    page.get_by_role("button", name="Cancel task…").click()
    page.get_by_label("Replaced by task (optional)").wait_for()
    save(page, shots, "task-cancel-confirm")
    assert person.get(task["taskId"])["state"] == "running"  # nothing happens before the confirmation
    page.get_by_role("button", name="Confirm cancel").click()
    expect_state(page.locator(".heading [data-state]"), "cancelled")
    assert person.get(task["taskId"])["cancellation"]["cause"] == "user_canceled"


def test_the_apis_refusal_is_shown_to_the_person(page: Any, person: Api, stack: Stack) -> None:
    result = run_cli(
        stack, "admin", "keys", "create", "--principal", "dana", "--agent", AGENT, "--allow-tool", "task_answer"
    )
    assert result.returncode == 0, result.stderr
    answer_only = result.stdout.strip().splitlines()[-1]
    task = person.create("not yours to stop", profile="behave", instructions=json.dumps([{"sleep": 120}]))
    person.wait_state(task["taskId"], "running")
    sign_in(page, answer_only)
    page.goto(f"/#/a/{AGENT}/s/{SESSION}/t/{task['taskId']}")
    page.get_by_role("button", name="Pause").click()
    wait_text(page, "#action-message", "403 TOOL_ACCESS_DENIED: this API key may not use task_cancel")
    assert person.get(task["taskId"])["state"] == "running"
    person.request("POST", f"/tasks/{task['taskId']}/cancel")
