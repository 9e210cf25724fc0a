"""The dashboard's static routes (strict headers, no API key, not in /openapi.json), GET /api/v1/me,
and the worker-log route's bounds, in-process."""

from __future__ import annotations

import re

from gateway_http.routes.dashboard import CSP
from tests.unit.gateway.conftest import Gateway
from tests.unit.gateway.test_edge import assert_error

LOG = "/api/v1/agents/agent-1/sessions/cli-1/tasks/" + "a" * 32 + "/log"


async def test_the_page_and_its_files_come_with_a_strict_policy_and_no_key(gateway: Gateway) -> None:
    page = await gateway.client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert page.headers["content-security-policy"] == CSP
    assert "'unsafe-inline'" not in CSP and "default-src 'self'" in CSP
    assert page.headers["x-content-type-options"] == "nosniff"
    assert page.headers["referrer-policy"] == "no-referrer"
    # No inline script or style in the page: every script and stylesheet is a file of ours.
    html = page.text
    assert "<style" not in html and " style=" not in html
    assert re.findall(r"<script[^>]*>", html) == ['<script type="module" src="/ui/app.js">']
    for name, kind in (("app.js", "text/javascript"), ("sse.js", "text/javascript"), ("app.css", "text/css")):
        asset = await gateway.client.get(f"/ui/{name}")
        assert asset.status_code == 200 and asset.headers["content-type"].startswith(kind), name
        assert asset.headers["content-security-policy"] == CSP


async def test_the_key_never_goes_in_a_url_or_a_cookie(gateway: Gateway) -> None:
    script = (await gateway.client.get("/ui/app.js")).text + (await gateway.client.get("/ui/sse.js")).text
    assert "sessionStorage" in script and "localStorage" not in script and "document.cookie" not in script
    assert "new EventSource(" not in script  # fetch() streams, which carry the header
    assert ".innerHTML" not in script and ".outerHTML" not in script  # worker-written text is set as text only


async def test_unknown_files_and_paths_are_404(gateway: Gateway) -> None:
    for path in ("/ui/nope.js", "/ui/../app.py", "/ui/%2e%2e%2fapp.py", "/ui/"):
        response = await gateway.client.get(path)
        assert response.status_code == 404, path


async def test_the_dashboard_is_not_in_the_api_document(gateway: Gateway) -> None:
    paths = (await gateway.client.get("/openapi.json")).json()["paths"]
    assert "/" not in paths and not any(p.startswith("/ui") for p in paths)
    assert "/api/v1/me" in paths and "/api/v1/agents/{agentId}/sessions/{sessionId}/tasks/{taskId}/log" in paths


async def test_me_names_the_principal_its_agents_and_sessions(gateway: Gateway) -> None:
    assert_error(await gateway.client.get("/api/v1/me"), 401, "UNAUTHENTICATED")
    bad = await gateway.client.get("/api/v1/me", headers={"Authorization": "Bearer nope"})
    assert_error(bad, 401, "UNAUTHENTICATED")
    _, secret = await gateway.store.db.run(
        lambda s: gateway.store.create_key(s, "dana", ["agent-1", "agent-2"], ["task_answer"])
    )
    await gateway.store.db.run(lambda s: gateway.store.add_member(s, "agent-1", "web-1", "dana"))
    await gateway.store.db.run(lambda s: gateway.store.add_member(s, "agent-9", "other", "dana"))  # no key access
    await gateway.store.db.run(lambda s: gateway.store.add_member(s, "agent-1", "web-2", "erin"))
    me = await gateway.client.get("/api/v1/me", headers={"Authorization": f"Bearer {secret}"})
    assert me.status_code == 200, me.text
    assert me.json() == {
        "principal": "dana",
        "allowTools": ["task_answer"],
        "agents": [
            {"agentId": "agent-1", "orchestrationEnabled": True, "sessions": ["web-1"]},
            {"agentId": "agent-2", "orchestrationEnabled": True, "sessions": []},
        ],
    }


async def test_the_log_tail_is_bounded_before_any_backend_is_asked(gateway: Gateway) -> None:
    _, secret = await gateway.store.db.run(lambda s: gateway.store.create_key(s, "dana", ["agent-1"], None))
    await gateway.store.db.run(lambda s: gateway.store.add_member(s, "agent-1", "cli-1", "dana"))
    headers = {"Authorization": f"Bearer {secret}"}
    for query in ("tailBytes=0", "tailBytes=65537", "tailBytes=x", "attempt=0"):
        assert_error(await gateway.client.get(f"{LOG}?{query}", headers=headers), 400, "INVALID_ARGUMENT")
    assert_error(await gateway.client.get(LOG), 401, "UNAUTHENTICATED")
