// The taskgate dashboard: plain JavaScript over the REST/SSE API, no build step.
// The API key lives in this tab's sessionStorage and goes only in the Authorization
// header. Everything shown is set as text (never innerHTML): task titles, results and
// logs come from workers, and workers are untrusted.

import { HttpError, errorOf, streamEvents } from "./sse.js";

const KEY = "taskgate.apiKey";
const TERMINAL = new Set(["completed", "failed", "cancelled"]);
const PAUSABLE = new Set(["queued", "running", "waiting_input"]);
const MAX_SAMPLES = 120; // observations kept per task while the page is open
const PAGE_SIZE = 10;

const state = {
  me: null,
  tasks: new Map(), // taskId -> latest full snapshot (a GET, the list, the task's own stream; attempts from a GET)
  slim: new Map(), // taskId -> latest slim snapshot from the session's task stream
  samples: new Map(), // taskId -> [{t, cpu, io}] from the task stream's task.execution events
  list: { key: "", filter: "active", page: 0, pages: 1, total: 0, ids: [] },
  taskStream: null, // {agent, session, controller}: the session's slim stream (list, conversation)
  taskWatch: null, // {agent, session, taskId, controller}: the open task page's own full stream
  activity: null, // {agent, session, controller}
  live: "",
  view: null, // {name, agent, session, taskId}
  fullReads: new Map(), // taskId -> {again}: a re-read of the full snapshot, waiting or in flight
  logTail: 16384,
};

// --- small helpers -------------------------------------------------------------------------------

function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on")) el.addEventListener(name.slice(2), value);
    else if (name === "class") el.className = value;
    else el.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

const svgNS = "http://www.w3.org/2000/svg";
function s(tag, attrs = {}) {
  const el = document.createElementNS(svgNS, tag);
  for (const [name, value] of Object.entries(attrs)) el.setAttribute(name, String(value));
  return el;
}

const enc = encodeURIComponent;
const apiKey = () => sessionStorage.getItem(KEY);
const base = (agent, session) => `/api/v1/agents/${enc(agent)}/sessions/${enc(session)}`;
const sessionHash = (agent, session) => `#/a/${enc(agent)}/s/${enc(session)}`;
const taskHash = (agent, session, taskId) => `${sessionHash(agent, session)}/t/${enc(taskId)}`;
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function when(iso) {
  if (!iso) return "—";
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? iso : d.toLocaleString();
}

function duration(ms) {
  if (ms === undefined || ms === null) return "—";
  const sec = Math.floor(ms / 1000);
  if (sec < 60) return `${sec}s`;
  const min = Math.floor(sec / 60);
  if (min < 60) return `${min}m ${sec % 60}s`;
  return `${Math.floor(min / 60)}h ${min % 60}m`;
}

function bytes(n) {
  if (n === undefined || n === null) return "—";
  if (n < 1024) return `${n} B`;
  if (n < 1024 * 1024) return `${(n / 1024).toFixed(1)} KiB`;
  return `${(n / 1024 / 1024).toFixed(1)} MiB`;
}

function elapsedOf(task) {
  const t = task.timing || {};
  if (!t.firstStartedAt && !t.startedAt) return null;
  let ms = t.elapsedMs || 0;
  if (!t.endedAt && !TERMINAL.has(task.state) && task._receivedAt) ms += Date.now() - task._receivedAt;
  return ms;
}

function toolText(tool) {
  if (!tool) return "—";
  let text = `${tool.name} · ${tool.status || "?"}`;
  if (tool.exitCode !== undefined) text += ` (exit ${tool.exitCode})`;
  return text;
}

function badge(taskState) {
  return h("span", { class: `state state-${taskState}`, "data-state": taskState }, taskState.replace("_", " "));
}

function flash(message, kind = "info") {
  const box = document.getElementById("flash");
  box.replaceChildren(message ? h("p", { class: `flash flash-${kind}` }, message) : "");
}

function describe(err) {
  if (err instanceof HttpError) return `${err.status} ${err.error}: ${err.message}`;
  return String(err && err.message ? err.message : err);
}

// --- the API -----------------------------------------------------------------------------------

async function api(path, { method = "GET", body, signal } = {}) {
  const headers = { Authorization: `Bearer ${apiKey()}`, Accept: "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    signal,
    cache: "no-store",
  });
  if (!response.ok) {
    const err = await errorOf(response);
    if (response.status === 401) signOut(`Signed out: ${err.message}`);
    throw err;
  }
  return response.json();
}

function remember(task, full = false) {
  const prev = state.tasks.get(task.taskId);
  if (prev && task.version < prev.version) {
    // A read that took longer than a later event: keep the newer snapshot (and a read's attempts).
    if (full) Object.assign(prev, { attempts: task.attempts || [], _full: true });
    return prev;
  }
  const merged = { ...task, _receivedAt: Date.now() };
  // Stream and list snapshots carry no attempts and may carry previews: keep what a full read gave.
  if (!full && prev) {
    if (!task.attempts || task.attempts.length === 0) merged.attempts = prev.attempts || [];
    // A GET names the latest attempt's harness and model; an event may not.
    if (merged.harness === undefined) merged.harness = prev.harness;
    if (merged.harnessModel === undefined) merged.harnessModel = prev.harnessModel;
    if (prev._full && prev.result && task.result && task.result.text.length < prev.result.text.length) {
      merged.result = prev.result;
    }
    merged._full = prev._full;
  }
  if (full) merged._full = true;
  state.tasks.set(task.taskId, merged);
  const e = task.execution;
  if (e && e.available && e.observedAt && e.cpu && e.io) {
    const list = state.samples.get(task.taskId) || [];
    const t = Date.parse(e.observedAt);
    if (!list.length || t > list[list.length - 1].t) {
      list.push({ t, cpu: e.cpu.userTicks + e.cpu.systemTicks, io: e.io.readBytes + e.io.writeBytes });
      if (list.length > MAX_SAMPLES) list.splice(0, list.length - MAX_SAMPLES);
      state.samples.set(task.taskId, list);
    }
  }
  return merged;
}

async function readFull(agent, session, taskId) {
  const { task } = await api(`${base(agent, session)}/tasks/${enc(taskId)}`);
  return remember(task, true);
}

// Debounced, one per task at a time: a burst of changes costs one GET (a change that comes in
// while it is in flight makes one more, after it).
function scheduleFullRead(agent, session, taskId) {
  const pending = state.fullReads.get(taskId);
  if (pending) {
    pending.again = true;
    return;
  }
  const read = { again: false };
  state.fullReads.set(taskId, read);
  setTimeout(async () => {
    read.again = false;
    try {
      await readFull(agent, session, taskId);
      refresh(taskId, true);
    } catch (err) {
      if (!(err instanceof HttpError && err.status === 401)) flash(describe(err), "error");
    } finally {
      state.fullReads.delete(taskId);
      if (read.again && state.view && state.view.agent === agent && state.view.session === session) {
        scheduleFullRead(agent, session, taskId);
      }
    }
  }, 250);
}

// --- live streams: the session's slim one (list) and a task's full one (task page) --------------

function setLive(text) {
  state.live = text;
  for (const el of document.querySelectorAll("[data-live]")) {
    el.textContent = text;
    el.dataset.live = text.startsWith("live") ? "on" : "off";
  }
}

// Follows an SSE stream until aborted: reconnects with backoff, stops for good on a refusal,
// and when the server ended it on purpose (``ended()``: a task stream after the finished snapshot).
function follow(url, controller, onEvent, ended = () => false) {
  (async () => {
    let delay = 1000;
    while (!controller.signal.aborted) {
      try {
        await streamEvents(url, apiKey(), {
          signal: controller.signal,
          onOpen: () => {
            delay = 1000;
            setLive("live");
          },
          onEvent,
        });
        if (!controller.signal.aborted && ended()) {
          setLive("final");
          return;
        }
      } catch (err) {
        if (controller.signal.aborted) return;
        if (err instanceof HttpError && err.status >= 400 && err.status < 500 && err.status !== 429) {
          setLive(`stopped: ${err.message}`);
          if (err.status === 401) signOut(`Signed out: ${err.message}`);
          return;
        }
      }
      if (controller.signal.aborted) return;
      setLive("reconnecting…");
      await sleep(delay);
      delay = Math.min(delay * 2, 15000);
    }
  })();
}

function parseEvent(event) {
  let doc;
  try {
    doc = JSON.parse(event.data);
  } catch {
    return null;
  }
  if (event.type === "error") {
    setLive(`interrupted: ${doc.message || doc.error}`);
    return null;
  }
  return doc.task ? doc.task : null;
}

function followTasks(agent, session) {
  const current = state.taskStream;
  if (current && current.agent === agent && current.session === session) return;
  if (current) current.controller.abort();
  const controller = new AbortController();
  state.taskStream = { agent, session, controller };
  follow(`${base(agent, session)}/tasks/events`, controller, (event) => onSlimEvent(agent, session, event));
}

function stopTaskStream() {
  if (state.taskStream) state.taskStream.controller.abort();
  state.taskStream = null;
}

function followTask(agent, session, taskId) {
  const current = state.taskWatch;
  if (current && current.agent === agent && current.session === session && current.taskId === taskId) return;
  stopTaskWatch();
  const controller = new AbortController();
  state.taskWatch = { agent, session, taskId, controller };
  const ended = () => {
    const task = state.tasks.get(taskId);
    return Boolean(task && TERMINAL.has(task.state));
  };
  follow(`${base(agent, session)}/tasks/${enc(taskId)}/events`, controller, (event) => onTaskPageEvent(agent, session, taskId, event), ended);
}

function stopTaskWatch() {
  if (state.taskWatch) state.taskWatch.controller.abort();
  state.taskWatch = null;
}

function stopFollowing() {
  stopTaskStream();
  stopTaskWatch();
  stopActivity();
}

// The session's slim stream: state and progress straight from the event; the detail a row shows
// (last tool, the question's text, attempts, timing) from a GET when the event says it moved.
function onSlimEvent(agent, session, event) {
  const slim = parseEvent(event);
  if (!slim) return;
  const prev = state.slim.get(slim.taskId);
  if (prev && slim.version < prev.version) return;
  state.slim.set(slim.taskId, slim);
  const list = state.list;
  if (!list.ids.includes(slim.taskId) && list.page === 0 && (list.filter === "all" || !TERMINAL.has(slim.state))) {
    if (event.type !== "task.snapshot" || list.filter === "active") {
      list.ids.unshift(slim.taskId);
      if (list.ids.length > PAGE_SIZE) list.ids.pop();
      list.total += event.type === "task.snapshot" ? 0 : 1;
    }
  }
  if (list.ids.includes(slim.taskId) && rowNeedsDetail(slim, state.tasks.get(slim.taskId), event.type)) {
    scheduleFullRead(agent, session, slim.taskId);
  }
  refresh(slim.taskId);
}

function rowNeedsDetail(slim, detail, type) {
  if (!detail) return true;
  if (slim.version <= detail.version) return false;
  const asked = slim.pendingQuestion;
  if (asked && !(detail.pendingQuestion && detail.pendingQuestion.questionId === asked.questionId)) return true; // its text
  if (slim.state !== detail.state) return true; // attempts, timing
  return type === "task.tool"; // the last tool
}

// A list row: the newer of the two snapshots for state and progress, the rest from the full one.
function rowTask(taskId) {
  const detail = state.tasks.get(taskId);
  const slim = state.slim.get(taskId);
  if (!slim || (detail && detail.version >= slim.version)) return detail;
  const row = { ...(detail || {}), taskId, title: slim.title, state: slim.state, progress: slim.progress, version: slim.version };
  const asked = slim.pendingQuestion;
  if (!asked) delete row.pendingQuestion;
  else if (!(detail && detail.pendingQuestion && detail.pendingQuestion.questionId === asked.questionId)) {
    row.pendingQuestion = { ...asked, text: "…" }; // its text comes with the re-read
  }
  return row;
}

// The task page's own stream: full snapshots, telemetry included; attempts from a GET on a state change.
function onTaskPageEvent(agent, session, taskId, event) {
  const snapshot = parseEvent(event);
  if (!snapshot || snapshot.taskId !== taskId) return;
  const prev = state.tasks.get(taskId);
  const task = remember(snapshot);
  const stateChanged = Boolean(prev && prev.state !== task.state);
  if (stateChanged) scheduleFullRead(agent, session, taskId);
  refresh(taskId, stateChanged);
}

// Re-render what shows this task.
function refresh(taskId, stateChanged = false) {
  const view = state.view;
  if (!view) return;
  if (view.name === "tasks") renderTaskRows();
  else if (view.name === "task" && view.taskId === taskId) renderTask(stateChanged);
}

// --- the router ---------------------------------------------------------------------------------

function parseRoute() {
  const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  if (parts[0] === "signin") return { name: "signin" };
  if (parts[0] === "a" && parts[2] === "s" && parts[1] && parts[3]) {
    const view = { agent: parts[1], session: parts[3] };
    if (parts[4] === "t" && parts[5]) return { ...view, name: "task", taskId: parts[5] };
    if (parts[4] === "conversation") return { ...view, name: "conversation" };
    return { ...view, name: "tasks" };
  }
  return { name: "sessions" };
}

async function route() {
  const view = parseRoute();
  if (!apiKey() && view.name !== "signin") {
    location.hash = "#/signin";
    return;
  }
  const listKey = view.agent ? `${view.agent}/${view.session}` : "";
  if (view.agent && state.list.key !== listKey) {
    stopFollowing();
    state.list = { key: listKey, filter: "active", page: 0, pages: 1, total: 0, ids: [] };
  }
  if (!view.agent) stopFollowing();
  if (view.name !== "conversation") stopActivity();
  // A task page follows its task's own stream; the list and the conversation, the session's.
  if (view.name === "task") stopTaskStream();
  else stopTaskWatch();
  state.view = view;
  crumbs(view);
  document.getElementById("signout").hidden = !apiKey();
  const main = document.getElementById("main");
  try {
    // A reload keeps the tab's key: check it once and learn whose it is.
    if (apiKey() && !state.me && view.name !== "signin") {
      state.me = await api("/api/v1/me");
      crumbs(view);
    }
    if (view.name === "signin") renderSignIn(main);
    else if (view.name === "sessions") await renderSessions(main);
    else if (view.name === "task") await openTask(main);
    else {
      followTasks(view.agent, view.session);
      if (view.name === "tasks") await renderTasks(main);
      else await renderConversation(main);
    }
  } catch (err) {
    if (!(err instanceof HttpError && err.status === 401)) {
      main.replaceChildren(h("h1", {}, "Something went wrong"), h("p", { class: "error", role: "alert" }, describe(err)));
    }
  }
}

function crumbs(view) {
  const nav = document.getElementById("crumbs");
  const items = [];
  if (apiKey()) items.push(h("a", { href: "#/" }, "Sessions"));
  if (view.agent) {
    items.push(h("a", { href: sessionHash(view.agent, view.session) }, `${view.agent} / ${view.session}`));
    if (view.name === "task") {
      const task = state.tasks.get(view.taskId);
      items.push(h("span", { "aria-current": "page" }, task ? task.title : view.taskId.slice(0, 8)));
    }
    if (view.name === "conversation") items.push(h("span", { "aria-current": "page" }, "Conversation"));
  }
  nav.replaceChildren(...items.flatMap((item, i) => (i ? [h("span", { class: "sep", "aria-hidden": "true" }, "›"), item] : [item])));
  const who = document.getElementById("who");
  who.textContent = state.me && apiKey() ? state.me.principal : "";
}

function focusHeading(main) {
  const heading = main.querySelector("h1");
  if (heading) {
    heading.setAttribute("tabindex", "-1");
    heading.focus({ preventScroll: true });
  }
}

// --- sign in, sessions --------------------------------------------------------------------------

function signOut(message) {
  sessionStorage.removeItem(KEY);
  state.me = null;
  stopFollowing();
  state.tasks.clear();
  state.slim.clear();
  state.samples.clear();
  if (message) flash(message, "error");
  if (location.hash !== "#/signin") location.hash = "#/signin";
  else route();
}

function renderSignIn(main) {
  const error = h("p", { class: "error", role: "alert", id: "signin-error" });
  const input = h("input", {
    id: "api-key",
    name: "apiKey",
    type: "password",
    autocomplete: "off",
    spellcheck: "false",
    required: true,
    "aria-describedby": "key-help signin-error",
  });
  const form = h(
    "form",
    {
      class: "card narrow",
      onsubmit: async (event) => {
        event.preventDefault();
        error.textContent = "";
        const candidate = input.value.trim();
        if (!candidate) return;
        try {
          const response = await fetch("/api/v1/me", {
            headers: { Authorization: `Bearer ${candidate}`, Accept: "application/json" },
            cache: "no-store",
          });
          if (!response.ok) throw await errorOf(response);
          state.me = await response.json();
          sessionStorage.setItem(KEY, candidate);
          input.value = "";
          flash("");
          location.hash = "#/";
        } catch (err) {
          error.textContent = err instanceof HttpError ? `Refused: ${err.message}` : describe(err);
          input.focus();
        }
      },
    },
    h("h1", {}, "Sign in"),
    h("label", { for: "api-key" }, "API key"),
    input,
    h(
      "p",
      { id: "key-help", class: "muted" },
      "Kept in this tab's session storage only, and sent as the Authorization header. Closing the tab forgets it.",
    ),
    error,
    h("button", { type: "submit", class: "primary" }, "Sign in"),
  );
  main.replaceChildren(form);
  input.focus();
}

async function renderSessions(main) {
  if (!state.me) state.me = await api("/api/v1/me");
  crumbs(state.view);
  const agents = state.me.agents || [];
  const blocks = agents.map((agent) =>
    h(
      "section",
      { class: "card" },
      h("h2", {}, agent.agentId, agent.orchestrationEnabled ? "" : h("span", { class: "muted" }, " (orchestration disabled)")),
      agent.sessions.length
        ? h(
            "ul",
            { class: "links" },
            agent.sessions.map((session) => h("li", {}, h("a", { href: sessionHash(agent.agentId, session) }, session))),
          )
        : h("p", { class: "muted" }, "No session of this agent has you as a member."),
    ),
  );
  const agentInput = h("input", { id: "open-agent", required: true, pattern: "[A-Za-z0-9][A-Za-z0-9._:-]{0,127}" });
  const sessionInput = h("input", { id: "open-session", required: true, pattern: "[A-Za-z0-9][A-Za-z0-9._:-]{0,127}" });
  const open = h(
    "form",
    {
      class: "card inline-form",
      onsubmit: (event) => {
        event.preventDefault();
        location.hash = sessionHash(agentInput.value.trim(), sessionInput.value.trim());
      },
    },
    h("h2", {}, "Open another session"),
    h("label", { for: "open-agent" }, "Agent"),
    agentInput,
    h("label", { for: "open-session" }, "Session"),
    sessionInput,
    h("button", { type: "submit" }, "Open"),
  );
  main.replaceChildren(
    h("h1", {}, "Sessions"),
    h("p", { class: "muted" }, `Signed in as ${state.me.principal}. Pick an agent's session.`),
    ...(blocks.length ? blocks : [h("p", {}, "This key has access to no agent.")]),
    open,
  );
  focusHeading(main);
}

function sessionTabs(view, current) {
  return h(
    "nav",
    { class: "tabs", "aria-label": "Session views" },
    h("a", { href: sessionHash(view.agent, view.session), "aria-current": current === "tasks" ? "page" : null }, "Tasks"),
    h(
      "a",
      { href: `${sessionHash(view.agent, view.session)}/conversation`, "aria-current": current === "conversation" ? "page" : null },
      "Conversation",
    ),
    h("span", { class: "live", "data-live": state.live.startsWith("live") ? "on" : "off", "aria-live": "polite" }, state.live || "connecting…"),
  );
}

// --- the task list ------------------------------------------------------------------------------

async function loadList() {
  const { agent, session } = state.view;
  const list = state.list;
  const query = `page=${list.page}&page_size=${PAGE_SIZE}&all=${list.filter === "all"}`;
  const page = await api(`${base(agent, session)}/tasks?${query}`);
  list.page = page.page;
  list.pages = page.pages;
  list.total = page.total;
  list.ids = page.tasks.map((task) => remember(task).taskId);
  // The list carries no attempts: one full read per task shown (and again on its state changes).
  for (const id of list.ids) if (!state.tasks.get(id)._full) scheduleFullRead(agent, session, id);
}

async function renderTasks(main) {
  const view = state.view;
  const filter = h(
    "fieldset",
    { class: "filter" },
    h("legend", {}, "Show"),
    ["active", "all"].map((value) =>
      h(
        "label",
        {},
        h("input", {
          type: "radio",
          name: "filter",
          value,
          checked: state.list.filter === value,
          onchange: async () => {
            state.list.filter = value;
            state.list.page = 0;
            await loadList();
            renderTaskRows();
          },
        }),
        value === "active" ? " Active" : " All",
      ),
    ),
  );
  const pager = h("nav", { class: "pager", "aria-label": "Pages", id: "pager" });
  main.replaceChildren(
    h("div", { class: "heading" }, h("h1", {}, "Tasks"), sessionTabs(view, "tasks")),
    filter,
    h("ul", { class: "tasks", id: "task-rows", "aria-live": "polite" }),
    pager,
  );
  focusHeading(main);
  await loadList();
  renderTaskRows();
}

function renderTaskRows() {
  const rows = document.getElementById("task-rows");
  if (!rows || !state.view || state.view.name !== "tasks") return;
  const { agent, session } = state.view;
  const list = state.list;
  const tasks = list.ids.map(rowTask).filter(Boolean);
  rows.replaceChildren(
    ...(tasks.length
      ? tasks.map((task) =>
          h(
            "li",
            { class: "task-row", "data-task-id": task.taskId },
            h("a", { class: "title", href: taskHash(agent, session, task.taskId) }, task.title || task.taskId),
            badge(task.state),
            h("span", { class: "progress" }, task.pendingQuestion ? `❓ ${task.pendingQuestion.text}` : task.progress ? task.progress.text : ""),
            h("span", { class: "meta" }, h("span", { class: "k" }, "last tool "), toolText(task.activity && task.activity.lastTool)),
            h("span", { class: "meta" }, h("span", { class: "k" }, "elapsed "), h("span", { "data-elapsed": task.taskId }, duration(elapsedOf(task)))),
            h("span", { class: "meta" }, h("span", { class: "k" }, "attempts "), task._full ? String((task.attempts || []).length) : "…"),
          ),
        )
      : [h("li", { class: "empty" }, list.filter === "active" ? "No active task. Choose “All” to see finished ones." : "No task yet.")]),
  );
  const pager = document.getElementById("pager");
  const go = (delta) => async () => {
    list.page = Math.max(0, list.page + delta);
    await loadList();
    renderTaskRows();
  };
  pager.replaceChildren(
    h("button", { type: "button", disabled: list.page <= 0, onclick: go(-1) }, "‹ Newer"),
    h("span", {}, `Page ${list.page + 1} of ${Math.max(1, list.pages)} · ${list.total} task${list.total === 1 ? "" : "s"}`),
    h("button", { type: "button", disabled: list.page + 1 >= list.pages, onclick: go(1) }, "Older ›"),
  );
}

// --- the task page ------------------------------------------------------------------------------

async function openTask(main) {
  const { agent, session, taskId } = state.view;
  main.replaceChildren(h("h1", {}, "Task"), h("p", { class: "muted" }, "Loading…"));
  await readFull(agent, session, taskId);
  crumbs(state.view);
  renderTask(true, true);
  focusHeading(main);
  followTask(agent, session, taskId);
}

function section(title, ...children) {
  return h("section", { class: "card" }, h("h2", {}, title), ...children);
}

function facts(pairs) {
  return h(
    "dl",
    { class: "facts" },
    pairs.filter(([, value]) => value !== undefined && value !== null && value !== "").flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]),
  );
}

// Keeps the person's half-typed answer and open panels across live re-renders.
const keep = { answer: "", cancelOpen: false, replacedBy: "", actionMessage: null };

function renderTask(stateChanged = false, first = false) {
  const main = document.getElementById("main");
  const view = state.view;
  const task = state.tasks.get(view.taskId);
  if (!task || !main) return;
  if (first) Object.assign(keep, { answer: "", cancelOpen: false, replacedBy: "", actionMessage: null });
  const active = document.activeElement && document.activeElement.id;
  const answerBox = document.getElementById("answer-text");
  if (answerBox) keep.answer = answerBox.value;
  const replacedBox = document.getElementById("replaced-by");
  if (replacedBox) keep.replacedBy = replacedBox.value;
  const logBlock = document.getElementById("log-block");

  const parts = [
    h(
      "div",
      { class: "heading" },
      h("h1", { id: "task-title" }, task.title || task.taskId),
      badge(task.state),
      h("span", { class: "live", "data-live": state.live.startsWith("live") ? "on" : "off" }, state.live || "connecting…"),
    ),
    // Reused while nothing they show changed, so a live update never moves the person's caret or focus.
    reuse("actions", [task.state, keep.cancelOpen, keep.actionMessage && keep.actionMessage.text].join("|"), () => actions(task)),
  ];
  if (task.pendingQuestion) {
    parts.push(reuse("question-block", task.pendingQuestion.questionId, () => questionBlock(task)));
  }
  parts.push(
    section(
      "Snapshot",
      facts([
        ["Task id", h("code", {}, task.taskId)],
        ["Profile", task.targetProfile],
        ["Execution", task.executionType],
        ["Harness", task.harness],
        ["Model", task.harnessModel],
        ["Created", when(task.timing && task.timing.createdAt)],
        ["Started", when(task.timing && (task.timing.firstStartedAt || task.timing.startedAt))],
        ["Ended", task.timing && task.timing.endedAt ? when(task.timing.endedAt) : null],
        ["Elapsed", h("span", { "data-elapsed": task.taskId }, duration(elapsedOf(task)))],
        ["Progress", task.progress ? `${task.progress.text} (${when(task.progress.updatedAt)})` : null],
        ["Last tool", task.activity && task.activity.lastTool ? toolText(task.activity.lastTool) : null],
        ["Last activity", task.activity && task.activity.lastActivityAt ? when(task.activity.lastActivityAt) : null],
        ["Workspace", task.workspace ? `${task.workspace.path} (${task.workspace.mode})` : null],
        ["Parent task", task.parentTaskId ? h("a", { href: taskHash(view.agent, view.session, task.parentTaskId) }, task.parentTaskId) : null],
        ["Continues", task.continueTaskId ? h("a", { href: taskHash(view.agent, view.session, task.continueTaskId) }, task.continueTaskId) : null],
        ["Skill", task.skill ? `${task.skill.name} ${JSON.stringify(task.skill.args || {})}` : null],
        ["Updated", when(task.updatedAt)],
      ]),
      task.instructions ? h("details", {}, h("summary", {}, "Instructions"), h("pre", { class: "text" }, task.instructions)) : null,
    ),
  );
  if (task.inspection) parts.push(section("Inspection", facts([["Reason", task.inspection.reason], ["Since", when(task.inspection.since)]])));
  if (task.result) {
    parts.push(
      section(
        "Result",
        h("pre", { class: "text", id: "result-text" }, task.result.text || "(empty)"),
        task.result.unresolvedBackground ? h("p", { class: "warn" }, "Accepted while background work was still unresolved.") : null,
      ),
    );
  }
  if (task.failure) {
    parts.push(
      section(
        "Failure",
        facts([
          ["Code", h("code", {}, task.failure.code)],
          ["Message", task.failure.message],
          ["Retryable", task.failure.retryable ? "yes" : "no"],
          ["Exit code", task.failure.exitCode],
        ]),
      ),
    );
  }
  if (task.cancellation) {
    const c = task.cancellation;
    parts.push(
      section(
        "Cancellation",
        facts([
          ["Requested", when(c.requestedAt)],
          ["Cause", c.cause],
          ["Replaced by", c.replacedByTaskId ? h("a", { href: taskHash(view.agent, view.session, c.replacedByTaskId) }, c.replacedByTaskId) : null],
          ["Cleanup", c.cleanup],
        ]),
      ),
    );
  }
  if (task.restartResume) {
    const r = task.restartResume;
    parts.push(section("Restart resume", facts([["Resumes", r.count], ["Revision", r.revision], ["Pending", r.pending ? "yes" : "no"], ["Last progress", r.lastProgress]])));
  }
  parts.push(executionBlock(task));
  parts.push(attemptsBlock(task));
  if (task.evidence) parts.push(evidenceBlock(task.evidence));
  if (task.subagents && task.subagents.length) parts.push(subtasksBlock(task));
  if (task.observedPaths && task.observedPaths.length) {
    parts.push(section("Files touched", h("ul", { class: "paths" }, task.observedPaths.map((p) => h("li", {}, h("code", {}, p))))));
  }
  parts.push(logBlock || h("section", { class: "card", id: "log-block" }, h("h2", {}, "Worker log"), h("pre", { class: "log", id: "log-text" }, "…")));
  main.replaceChildren(...parts);
  if (active) {
    const again = document.getElementById(active);
    if (again) again.focus({ preventScroll: true });
  }
  if (!logBlock || stateChanged) loadLog();
}

function reuse(id, signature, build) {
  const old = document.getElementById(id);
  if (old && old.dataset.signature === signature) return old;
  const el = build();
  el.id = id;
  el.dataset.signature = signature;
  return el;
}

function actionMessage() {
  const m = keep.actionMessage;
  return h(
    "p",
    { id: "action-message", tabindex: "-1", class: m ? (m.error ? "error" : "ok") : "", role: m && m.error ? "alert" : "status" },
    m ? m.text : "",
  );
}

async function act(label, path, body) {
  const { agent, session, taskId } = state.view;
  keep.actionMessage = { text: `${label}…`, error: false };
  renderTask();
  try {
    const reply = await api(`${base(agent, session)}/tasks/${enc(taskId)}/${path}`, { method: "POST", body });
    keep.actionMessage = { text: `${label}: ${reply.task.state}`, error: false };
    await readFull(agent, session, taskId);
    return true;
  } catch (err) {
    keep.actionMessage = { text: describe(err), error: true };
    return false;
  } finally {
    renderTask(true);
    // The button pressed may be gone (a finished task has none): keep keyboard focus in the page.
    const main = document.getElementById("main");
    if (main && !main.contains(document.activeElement)) document.getElementById("action-message")?.focus();
  }
}

function actions(task) {
  const buttons = [];
  if (!TERMINAL.has(task.state)) {
    buttons.push(
      h(
        "button",
        { type: "button", id: "cancel-open", class: "danger", "aria-expanded": String(keep.cancelOpen), onclick: () => {
          keep.cancelOpen = !keep.cancelOpen;
          renderTask();
          const box = document.getElementById(keep.cancelOpen ? "replaced-by" : "cancel-open");
          if (box) box.focus();
        } },
        "Cancel task…",
      ),
    );
  }
  if (PAUSABLE.has(task.state)) buttons.push(h("button", { type: "button", id: "pause", onclick: () => act("Pause", "pause") }, "Pause"));
  if (task.state === "paused") buttons.push(h("button", { type: "button", id: "resume", class: "primary", onclick: () => act("Resume", "resume") }, "Resume"));
  if (task.state === "needs_reconciliation") {
    buttons.push(h("button", { type: "button", id: "retry-cleanup", onclick: () => act("Retry cleanup", "retry-cleanup") }, "Retry cleanup"));
  }
  const panel =
    keep.cancelOpen && !TERMINAL.has(task.state)
      ? h(
          "form",
          {
            class: "confirm",
            id: "cancel-form",
            onsubmit: async (event) => {
              event.preventDefault();
              const replacedBy = document.getElementById("replaced-by").value.trim();
              keep.cancelOpen = false;
              keep.replacedBy = "";
              await act("Cancel", "cancel", replacedBy ? { replacedByTaskId: replacedBy } : {});
            },
          },
          h("p", {}, "Cancel this task? Its worker is stopped; the task ends cancelled once the stop is proven."),
          h("label", { for: "replaced-by" }, "Replaced by task (optional)"),
          h("input", { id: "replaced-by", value: keep.replacedBy, placeholder: "32 hex digits", pattern: "[0-9a-f]{32}", autocomplete: "off" }),
          h("div", { class: "row" },
            h("button", { type: "submit", class: "danger", id: "cancel-confirm" }, "Confirm cancel"),
            h("button", { type: "button", onclick: () => { keep.cancelOpen = false; renderTask(); document.getElementById("cancel-open").focus(); } }, "Keep it"),
          ),
        )
      : null;
  return h("section", { class: "actions", "aria-label": "Actions" }, h("div", { class: "row" }, buttons), panel, actionMessage());
}

function questionBlock(task) {
  const q = task.pendingQuestion;
  const text = h("textarea", { id: "answer-text", rows: 3, required: true, "aria-describedby": "question-text" });
  text.value = keep.answer;
  return h(
    "section",
    { class: "card question" },
    h("h2", {}, "Question"),
    h("p", { id: "question-text", class: "question-text" }, q.text),
    h(
      "form",
      {
        id: "answer-form",
        onsubmit: async (event) => {
          event.preventDefault();
          const answer = document.getElementById("answer-text").value;
          keep.answer = answer;
          if (await act("Answer", "answer", { questionId: q.questionId, answer })) {
            keep.answer = "";
            const box = document.getElementById("answer-text");
            if (box) box.value = "";
          }
        },
      },
      h("label", { for: "answer-text" }, "Your answer"),
      text,
      h("button", { type: "submit", class: "primary", id: "answer-send" }, "Send answer"),
    ),
  );
}

function sparkline(values, label) {
  const width = 240;
  const height = 48;
  const svg = s("svg", { viewBox: `0 0 ${width} ${height}`, class: "spark", role: "img", "aria-label": label });
  if (values.length === 1) values = [values[0], values[0]];
  const max = Math.max(...values, 1);
  const step = values.length > 1 ? width / (values.length - 1) : width;
  const points = values.map((v, i) => `${(i * step).toFixed(1)},${(height - 2 - (v / max) * (height - 4)).toFixed(1)}`);
  svg.append(s("polyline", { points: points.join(" "), fill: "none", stroke: "currentColor", "stroke-width": 2 }));
  return svg;
}

function executionBlock(task) {
  const e = task.execution;
  const samples = state.samples.get(task.taskId) || [];
  const children = [];
  if (!e) children.push(h("p", { class: "muted" }, "No observation yet."));
  else if (!e.available) children.push(h("p", { class: "muted" }, `Telemetry unavailable: ${e.reason || "no reason given"}`));
  else {
    children.push(
      facts([
        ["Observed", when(e.observedAt)],
        ["CPU ticks", `${e.cpu.userTicks} user, ${e.cpu.systemTicks} system`],
        ["IO", `${bytes(e.io.readBytes)} read, ${bytes(e.io.writeBytes)} written`],
        ["Processes", String((e.processes || []).length)],
      ]),
    );
  }
  if (samples.length >= 2) {
    const cpu = [];
    const io = [];
    for (let i = 1; i < samples.length; i += 1) {
      const dt = Math.max((samples[i].t - samples[i - 1].t) / 1000, 0.001);
      cpu.push(Math.max(0, samples[i].cpu - samples[i - 1].cpu) / dt);
      io.push(Math.max(0, samples[i].io - samples[i - 1].io) / dt);
    }
    const last = (list) => list[list.length - 1];
    children.push(
      h(
        "div",
        { class: "sparks", id: "sparklines" },
        h("figure", {}, sparkline(cpu, "CPU ticks per second"), h("figcaption", {}, `CPU ${last(cpu).toFixed(1)} ticks/s`)),
        h("figure", {}, sparkline(io, "IO bytes per second"), h("figcaption", {}, `IO ${bytes(Math.round(last(io)))}/s`)),
      ),
      h("p", { class: "muted" }, `${samples.length} observations since this page opened.`),
    );
  } else if (e && e.available) {
    children.push(h("p", { class: "muted" }, "The CPU/IO sparkline fills in as observations arrive."));
  }
  return section("Execution", ...children);
}

function attemptsBlock(task) {
  const attempts = task.attempts || [];
  if (!attempts.length) return section("Attempts", h("p", { class: "muted" }, "No attempt yet."));
  const usage = (u) => (u ? [u.inputTokens, u.cachedInputTokens, u.outputTokens].map((n) => (n === undefined ? "—" : n)).join(" / ") : "—");
  return section(
    "Attempts",
    h(
      "div",
      { class: "scroll" },
      h(
        "table",
        { class: "attempts" },
        h("thead", {}, h("tr", {}, ["#", "Started", "Ended", "Outcome", "Exit", "Harness", "Model", "Tokens in / cached / out", "PID"].map((c) => h("th", { scope: "col" }, c)))),
        h(
          "tbody",
          {},
          attempts.map((a) =>
            h(
              "tr",
              {},
              h("td", {}, a.number),
              h("td", {}, when(a.startedAt)),
              h("td", {}, a.endedAt ? when(a.endedAt) : "—"),
              h("td", {}, a.outcome || "—"),
              h("td", {}, a.exitCode === undefined ? "—" : a.exitCode),
              h("td", {}, a.harness || "—"),
              h("td", {}, a.harnessModel || "—"),
              h("td", {}, usage(a.usage)),
              h("td", {}, a.pid || "—"),
            ),
          ),
        ),
      ),
    ),
  );
}

function evidenceBlock(evidence) {
  const list = (items) =>
    items && items.length ? h("ul", {}, items.map((item) => h("li", {}, typeof item === "string" ? item : JSON.stringify(item)))) : "—";
  return section(
    "Evidence",
    facts([
      ["Skills", list(evidence.skills)],
      ["Sub-agents", list(evidence.subagents)],
      ["Models", list(evidence.subagentModels)],
    ]),
  );
}

function subtasksBlock(task) {
  const { agent, session } = state.view;
  return section(
    "Sub-tasks",
    h(
      "ul",
      { class: "links" },
      task.subagents.map((sub) => {
        if (typeof sub === "string") return h("li", {}, h("a", { href: taskHash(agent, session, sub) }, sub));
        const label = [sub.title || sub.taskId, sub.state, sub.harnessModel].filter(Boolean).join(" · ");
        return h("li", {}, sub.taskId ? h("a", { href: taskHash(agent, session, sub.taskId) }, label) : label);
      }),
    ),
  );
}

let logLoading = null;
async function loadLog() {
  const { agent, session, taskId } = state.view;
  if (logLoading) return;
  logLoading = (async () => {
    const block = document.getElementById("log-block");
    if (!block) return;
    const sizes = [4096, 16384, 65536];
    const select = h(
      "select",
      { id: "log-tail", onchange: (event) => { state.logTail = Number(event.target.value); loadLog(); } },
      sizes.map((n) => h("option", { value: n, selected: state.logTail === n }, `last ${n / 1024} KiB`)),
    );
    const header = h(
      "div",
      { class: "row" },
      h("h2", {}, "Worker log"),
      h("label", { for: "log-tail", class: "visually-hidden" }, "How much of the log"),
      select,
      h("button", { type: "button", id: "log-refresh", onclick: () => loadLog() }, "Refresh"),
    );
    try {
      const log = await api(`${base(agent, session)}/tasks/${enc(taskId)}/log?tailBytes=${state.logTail}`);
      const note = !log.attempt
        ? "No attempt yet: no log."
        : log.expired
          ? `Attempt ${log.attempt} · its log was deleted: the attempt ended longer ago than the log retention.`
          : `Attempt ${log.attempt} · ${bytes(log.sizeBytes)}${log.truncated ? " · showing the end" : ""}`;
      const pre = h("pre", { class: "log", id: "log-text", tabindex: "0", "aria-label": "Worker log" }, log.text || "(empty)");
      block.replaceChildren(header, h("p", { class: "muted" }, note), pre);
      pre.scrollTop = pre.scrollHeight;
    } catch (err) {
      block.replaceChildren(header, h("p", { class: "error", role: "alert" }, describe(err)));
    }
  })();
  try {
    await logLoading;
  } finally {
    logLoading = null;
  }
}

// --- the conversation ---------------------------------------------------------------------------

function stopActivity() {
  if (state.activity) state.activity.controller.abort();
  state.activity = null;
}

async function renderConversation(main) {
  const view = state.view;
  const responses = h("ul", { class: "responses", id: "responses", "aria-live": "polite" });
  const messages = h("ol", { class: "messages", id: "messages" });
  const more = h("button", { type: "button", id: "messages-more", hidden: true }, "Earlier messages");
  main.replaceChildren(
    h("div", { class: "heading" }, h("h1", {}, "Conversation"), sessionTabs(view, "conversation")),
    section("Activity", h("p", { class: "muted", id: "activity-state" }, "connecting…"), responses),
    section("Messages", more, messages),
  );
  focusHeading(main);
  // The history is oldest first: show its last page, and earlier pages on request.
  let first = 0;
  const url = (page) => `${base(view.agent, view.session)}/messages?page=${page}&page_size=20`;
  const items = (reply) =>
    reply.messages.map((m) =>
      h(
        "li",
        { class: `message role-${m.role}` },
        h("div", { class: "meta" }, h("strong", {}, m.role), " · ", when(m.completedAt || m.createdAt)),
        h("p", { class: "text" }, m.text),
      ),
    );
  const loadLatest = async () => {
    let reply = await api(url(0));
    if (reply.pages > 1) reply = await api(url(reply.pages - 1));
    first = reply.page;
    messages.replaceChildren(...(reply.messages.length ? items(reply) : [h("li", { class: "empty" }, "No message yet.")]));
    more.hidden = first <= 0;
  };
  more.addEventListener("click", async () => {
    const reply = await api(url(first - 1));
    first = reply.page;
    messages.prepend(...items(reply));
    more.hidden = first <= 0;
  });
  await loadLatest();
  followActivity(view, responses, () => loadLatest().catch(() => {}));
}

function followActivity(view, list, onFinal) {
  stopActivity();
  const controller = new AbortController();
  state.activity = { agent: view.agent, session: view.session, controller };
  const shown = new Map(); // responseId -> li
  let lastId = null;
  const status = (text) => {
    const el = document.getElementById("activity-state");
    if (el) el.textContent = text;
  };
  (async () => {
    let delay = 1000;
    while (!controller.signal.aborted) {
      try {
        await streamEvents(`${base(view.agent, view.session)}/activity/stream`, apiKey(), {
          signal: controller.signal,
          lastEventId: lastId,
          onOpen: () => {
            delay = 1000;
            status("live");
          },
          onEvent: (event) => {
            if (event.id) lastId = event.id;
            let doc;
            try {
              doc = JSON.parse(event.data);
            } catch {
              return;
            }
            if (event.type === "error") {
              status(`interrupted: ${doc.message || doc.error}`);
              return;
            }
            if (event.type === "notification") {
              list.prepend(h("li", { class: "notification" }, h("strong", {}, doc.kind || "notification"), " ", doc.text || ""));
              return;
            }
            // A response snapshot replaces the previous one of the same response.
            let item = shown.get(doc.responseId);
            if (!item) {
              item = h("li", { class: "response", "data-response-id": doc.responseId });
              shown.set(doc.responseId, item);
              list.prepend(item);
            }
            item.replaceChildren(h("p", { class: "text" }, doc.text), h("span", { class: "muted" }, doc.final ? "final" : "writing…"));
            if (doc.final) onFinal();
          },
        });
      } catch (err) {
        if (controller.signal.aborted) return;
        if (err instanceof HttpError && err.status >= 400 && err.status < 500 && err.status !== 429) {
          status(`stopped: ${err.message}`);
          return;
        }
      }
      if (controller.signal.aborted) return;
      status("reconnecting…");
      await sleep(delay);
      delay = Math.min(delay * 2, 15000);
    }
  })();
}

// --- start ---------------------------------------------------------------------------------------

document.getElementById("signout").addEventListener("click", () => signOut("Signed out."));
document.getElementById("skip").addEventListener("click", (event) => {
  event.preventDefault(); // the hash is the router's: focus the content instead of navigating
  document.getElementById("main").focus();
});
window.addEventListener("hashchange", route);
// Live elapsed times: a clock in the page, not a request to the server.
setInterval(() => {
  for (const el of document.querySelectorAll("[data-elapsed]")) {
    const task = state.view && state.view.name === "tasks" ? rowTask(el.dataset.elapsed) : state.tasks.get(el.dataset.elapsed);
    if (task && !TERMINAL.has(task.state)) el.textContent = duration(elapsedOf(task));
  }
}, 1000);
route();
