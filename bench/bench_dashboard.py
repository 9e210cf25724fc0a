"""The web dashboard: what a browser downloads, how soon it can be used, how soon a new task
shows up live, and what a worker-log tail costs at the edge.

- page weight: every file the dashboard loads (uncompressed; no build step, no framework);
- cold load: a fresh browser context → the sign-in form ready (headless Chromium, N=10);
- live: REST create → the task's row in an open task list (SSE over fetch), N=20;
- log tail: GET .../tasks/{id}/log?tailBytes=65536 of a 1 MiB log vs GET .../tasks/{id} (N=200).

Run: .venv/bin/python bench/bench_dashboard.py   (or `make bench`); needs /usr/bin/chromium.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_edge import report, timed  # noqa: E402
from services.scheduler.worker_log import attempt_log_path  # noqa: E402
from tests.e2e.conftest import add_member, create_key  # noqa: E402
from tests.support.stack import make_stack  # noqa: E402

AGENT, SESSION = "agent-1", "web-bench"
CHROMIUM = "/usr/bin/chromium"
N_LOAD, N_LIVE, N_LOG = 10, 20, 200
FILES = ["/", "/ui/app.css", "/ui/app.js", "/ui/sse.js", "/ui/favicon.svg"]


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1)))]


def main() -> None:
    from playwright.sync_api import expect, sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        stack = make_stack(Path(tmp))
        print("starting the five services ...", flush=True)
        stack.start()
        try:
            key = create_key(stack, "bench", AGENT)
            add_member(stack, AGENT, SESSION, "bench")
            base = f"{stack.http_url}/api/v1/agents/{AGENT}/sessions/{SESSION}"
            sizes = {path: len(httpx.get(stack.http_url + path, timeout=10).content) for path in FILES}
            each = ", ".join(f"{path} {n / 1024:.1f} KiB" for path, n in sizes.items())
            print(f"page weight: {sum(sizes.values()) / 1024:.1f} KiB in {len(sizes)} files, uncompressed ({each})")
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, headless=True)
                loads = []
                for _ in range(N_LOAD):
                    context = browser.new_context(base_url=stack.http_url)
                    page = context.new_page()
                    start = time.perf_counter()
                    page.goto("/")
                    page.get_by_label("API key").wait_for()
                    loads.append((time.perf_counter() - start) * 1000)
                    context.close()
                print(f"cold load → sign-in form ready: p50 {statistics.median(loads):.0f} ms, max {max(loads):.0f} ms")

                context = browser.new_context(base_url=stack.http_url)
                page = context.new_page()
                page.goto("/")
                page.get_by_label("API key").fill(key)
                page.get_by_role("button", name="Sign in").click()
                page.get_by_role("heading", name="Sessions").wait_for()
                page.goto(f"/#/a/{AGENT}/s/{SESSION}")
                expect(page.locator(".live")).to_have_attribute("data-live", "on", timeout=20_000)
                page.get_by_label("All").check()
                live = []
                with httpx.Client(headers={"Authorization": f"Bearer {key}"}, timeout=30) as client:
                    for i in range(N_LIVE):
                        start = time.perf_counter()
                        created = client.post(f"{base}/tasks", json={"title": f"t{i}", "profile": "exit-at-once"})
                        task_id = created.json()["task"]["taskId"]
                        page.locator(f'[data-task-id="{task_id}"]').wait_for(timeout=20_000)
                        live.append((time.perf_counter() - start) * 1000)
                    print(
                        f"REST create → row shown live: p50 {statistics.median(live):.0f} ms, "
                        f"p99 {pct(live, 0.99):.0f} ms (N={N_LIVE}; includes the create itself)"
                    )
                    context.close()
                    browser.close()

                    # A finished task whose log holds 1 MiB: the tail reads only its last 64 KiB.
                    log = attempt_log_path(Path(tmp), task_id, 1)
                    deadline = time.monotonic() + 20
                    while not log.exists() and time.monotonic() < deadline:
                        time.sleep(0.05)
                    with log.open("ab") as f:
                        f.write((b"x" * 1023 + b"\n") * 1024)
                    report(
                        "GET task (REST)",
                        timed(N_LOG, lambda: client.get(f"{base}/tasks/{task_id}").raise_for_status()),
                    )
                    report(
                        "GET log tail 64 KiB of 1 MiB (REST)",
                        timed(
                            N_LOG, lambda: client.get(f"{base}/tasks/{task_id}/log?tailBytes=65536").raise_for_status()
                        ),
                    )
        finally:
            stack.stop()


if __name__ == "__main__":
    main()
