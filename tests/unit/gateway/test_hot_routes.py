"""The fast path for creating and listing a session's tasks answers exactly as the FastAPI
routes do: each request below goes once through the gateway as served and once through the
FastAPI app alone, and both answers (status, body, content type) and the scheduler requests
they made must be equal — for the happy path it serves and every refusal it hands on."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import httpx
import pytest
from fastapi import FastAPI
from starlette.types import Receive, Scope, Send

from gateway_http.create_batches import CreateBatches
from gateway_http.hot_routes import HotRoutes
from gateway_http.metrics import HTTP_DURATION
from gateway_http.middleware import RequestContextMiddleware
from taskgate.scheduler.v1 import scheduler_pb2 as pb
from tests.unit.gateway.conftest import Gateway

BASE = "/api/v1/agents/agent-1/sessions/cli-1/tasks"
CONTINUED = "0123456789abcdef0123456789abcdef"


def snapshot() -> pb.Task:
    task = pb.Task(task_id="f" * 32, agent_id="agent-1", session_id="cli-1", title="b", version=3)
    task.state = pb.TASK_STATE_QUEUED
    task.timing.create_time.FromMilliseconds(1_700_000_000_000)
    task.update_time.FromMilliseconds(1_700_000_000_500)
    return task


@dataclass
class FakeScheduler:
    seen: list[Any] = field(default_factory=list)
    fail: grpc.aio.AioRpcError | None = None

    async def CreateTasks(self, request: pb.CreateTasksRequest, **kwargs: Any) -> pb.CreateTasksResponse:
        self.seen.extend(item.request for item in request.items)
        if self.fail is not None:
            raise self.fail
        return pb.CreateTasksResponse(outcomes=[pb.CreateTaskOutcome(task=snapshot()) for _ in request.items])

    async def ListTasks(self, request: pb.ListTasksRequest, **kwargs: Any) -> pb.ListTasksResponse:
        self.seen.append(request)
        return pb.ListTasksResponse(page=request.page, pages=1, total=1, tasks=[snapshot()])


@dataclass
class FakeBackends:
    scheduler: FakeScheduler
    timeout_s: float = 5.0

    def __post_init__(self) -> None:
        self.creates = CreateBatches(self.scheduler)  # type: ignore[arg-type]

    async def create_task(self, request: pb.CreateTaskRequest, request_id: str) -> pb.CreateTaskResponse:
        return await self.creates.create(request, request_id, self.timeout_s)


@dataclass
class Pair:
    served: httpx.AsyncClient
    plain: httpx.AsyncClient
    scheduler: FakeScheduler
    secret: str
    gateway: Gateway
    fast: list[str] = field(default_factory=list)  # the requests the fast path answered

    async def both(self, method: str, url: str, **kwargs: Any) -> tuple[httpx.Response, list[Any]]:
        answers, requests = [], []
        self.fast.clear()
        for client in (self.served, self.plain):
            self.scheduler.seen.clear()
            answers.append(await client.request(method, url, **kwargs))
            requests.append(list(self.scheduler.seen))
        served, plain = answers
        assert served.status_code == plain.status_code, (served.text, plain.text)
        assert served.headers.get("content-type") == plain.headers.get("content-type")
        assert served.json() == plain.json()
        assert served.headers["x-request-id"] and plain.headers["x-request-id"]
        assert requests[0] == requests[1]
        return served, requests[0]


@pytest.fixture
async def pair(gateway: Gateway, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Pair]:
    scheduler = FakeScheduler()
    answer = HotRoutes._answer

    async def counted(self: HotRoutes, scope: Scope, *args: Any) -> None:
        made.fast.append(scope["path"])
        await answer(self, scope, *args)

    monkeypatch.setattr(HotRoutes, "_answer", counted)
    real = gateway.app.state.backends
    gateway.app.state.backends = FakeBackends(scheduler)
    _, secret = await gateway.store.db.run(lambda s: gateway.store.create_key(s, "dana", ["agent-1"], None))
    await gateway.store.db.run(lambda s: gateway.store.add_member(s, "agent-1", "cli-1", "dana"))
    # The FastAPI app alone: the same stack the gateway serves, without the fast path.
    app: FastAPI = gateway.app
    stack = RequestContextMiddleware(FastAPI.build_middleware_stack(app), app.max_body_size)

    async def plain_app(scope: Scope, receive: Receive, send: Send) -> None:
        scope["app"] = app  # as FastAPI.__call__ does
        await stack(scope, receive, send)

    plain = httpx.AsyncClient(transport=httpx.ASGITransport(app=plain_app), base_url="http://gateway")
    made = Pair(gateway.client, plain, scheduler, secret, gateway)
    yield made
    await plain.aclose()
    gateway.app.state.backends = real  # the fixture closes it


def auth(pair: Pair, scheme: str = "Bearer") -> dict[str, str]:
    return {"Authorization": f"{scheme} {pair.secret}"}


async def test_creates_answer_and_ask_the_scheduler_alike(pair: Pair) -> None:
    full = {
        "title": "  review  ",
        "instructions": "do it",
        "profile": "default-worker",
        "requestId": "req-1",
        "harness": "h",
        "harnessModel": "m",
        "continueTaskId": CONTINUED,
    }
    for body in ({"title": "b"}, {"title": "b", "profile": None}, full, {"title": "s", "skill": {"name": "x"}}):
        answer, requests = await pair.both("POST", BASE, json=body, headers=auth(pair))
        assert answer.status_code in (201, 400), answer.text
    answer, requests = await pair.both("POST", BASE, json={"title": "b"}, headers=auth(pair))
    assert pair.fast == [BASE], "answered by the fast path"
    assert answer.status_code == 201 and answer.json()["task"]["taskId"] == "f" * 32
    assert len(requests) == 1 and requests[0].title == "b" and requests[0].session_id == "cli-1"


@pytest.mark.parametrize(
    "body",
    [
        b'{"title": "b"',  # not JSON
        b"[1, 2]",
        b'{"title": "b", "unknown": 1}',
        b'{"title": "b", "profile": "no-such-profile"}',
        b'{"title": "\\ud800"}',  # a lone surrogate
        b'{"title": "b", "requestId": "bad id"}',
        b'{"title": "b", "target": {"name": "nowhere", "nativeSessionId": "n"}}',  # the full app's path
        b'{"title": "' + b"x" * 5000 + b'"}',  # over the fixture's 4096-byte limit
    ],
)
async def test_an_unusual_or_refused_body_gets_the_same_answer(pair: Pair, body: bytes) -> None:
    headers = {**auth(pair), "Content-Type": "application/json"}
    answer, requests = await pair.both("POST", BASE, content=body, headers=headers)
    assert (answer.status_code >= 400 and not requests) or answer.status_code == 201
    assert not pair.fast, "handed on to the FastAPI app"


async def test_a_body_the_model_accepts_is_served_fast_even_if_the_scheduler_refuses_it(pair: Pair) -> None:
    answer, requests = await pair.both("POST", BASE, json={"title": "   "}, headers=auth(pair))
    assert pair.fast == [BASE] and requests[0].title == "   "  # the scheduler answers for blank titles


async def test_refused_callers_and_odd_requests_get_the_same_answer(pair: Pair) -> None:
    _, other = await pair_key(pair, "erin", ["agent-1"])  # not a member of cli-1
    _, elsewhere = await pair_key(pair, "dana", ["agent-2"])  # no access to agent-1
    title = {"json": {"title": "b"}}
    # (method, url, request arguments, whether the fast path answers it)
    cases: list[tuple[str, str, dict[str, Any], bool]] = [
        ("POST", BASE, title, False),
        ("POST", BASE, {**title, "headers": {"Authorization": "Bearer tg_unknown"}}, False),
        ("POST", BASE, {**title, "headers": {"Authorization": f"Bearer {other}"}}, False),
        ("POST", BASE, {**title, "headers": {"Authorization": f"Bearer {elsewhere}"}}, False),
        ("POST", BASE, {**title, "headers": auth(pair, "bearer")}, True),  # the scheme is case-blind
        ("POST", BASE, {**title, "headers": auth(pair, "Basic")}, False),
        ("POST", BASE, {"content": b'{"title": "b"}', "headers": {**auth(pair), "Content-Type": "text/plain"}}, False),
        ("POST", "/api/v1/agents/agent-1/sessions/-bad/tasks", {**title, "headers": auth(pair)}, False),
        ("GET", BASE, {}, False),
        ("GET", BASE, {"headers": {"Authorization": f"Bearer {other}"}}, False),
    ]
    for query, fast in [
        ("", True),
        ("?page_size=1", True),
        ("?page=2&page_size=5&all=true", True),
        ("?all=false", True),
        ("?all=1", False),
        ("?page_size=0", False),
        ("?page_size=101", False),
        ("?page=-1", False),
        ("?page=x", False),
        ("?x=1", False),
        ("?page=1&page=2", False),
        ("?page_size", False),
    ]:
        cases.append(("GET", BASE + query, {"headers": auth(pair)}, fast))
    for method, url, kwargs, fast in cases:
        answer, _ = await pair.both(method, url, **kwargs)
        assert answer.status_code in (200, 201, 400, 401, 403, 404), (method, url, answer.text)
        assert bool(pair.fast) == fast, (method, url, kwargs)


async def test_a_backend_error_is_mapped_alike(pair: Pair) -> None:
    pair.scheduler.fail = grpc.aio.AioRpcError(
        grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "down"
    )
    answer, requests = await pair.both("POST", BASE, json={"title": "b"}, headers=auth(pair))
    assert answer.status_code == 503 and len(requests) == 1


async def pair_key(pair: Pair, principal: str, agents: list[str]) -> tuple[str, str]:
    store = pair.gateway.store
    key, secret = await store.db.run(lambda s: store.create_key(s, principal, agents, None))
    return key.key_id, secret


async def test_the_first_fast_answer_is_timed_under_its_route_template(pair: Pair) -> None:

    def count(method: str, status: str) -> float:
        labels = {"method": method, "route": "/api/v1/agents/{agentId}/sessions/{sessionId}/tasks", "status": status}
        samples = list(HTTP_DURATION.collect())[0].samples
        return sum(s.value for s in samples if s.name.endswith("_count") and s.labels == labels)

    before = count("POST", "201"), count("GET", "200")
    # The fresh gateway's very first requests, both answered by the fast path.
    await pair.served.post(BASE, json={"title": "b"}, headers=auth(pair))
    await pair.served.get(BASE, headers=auth(pair))
    assert pair.fast == [BASE, BASE]
    assert (count("POST", "201"), count("GET", "200")) == (before[0] + 1, before[1] + 1)
