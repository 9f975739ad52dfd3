// cao dashboard: plain ES module, no build step. State comes from the HTTP API once, then from the
// event stream (GET /events, Server-Sent Events; the browser resumes with Last-Event-ID by itself).
import { Terminal } from "/ui/vendor/xterm/xterm.mjs";

const $ = (sel, root = document) => root.querySelector(sel);
const main = $("#main");
const state = {
  terminals: new Map(), // id -> terminal view (GET /terminals)
  messages: new Map(), // id -> message view (GET /messages)
  since: new Map(), // terminal id -> ms when its status last changed (seen here)
  providers: [],
  defaultProvider: "scripted",
  route: "",
  attention: null, // GET /terminals/{id}/attention of the terminal view's agent
  notifications: [], // GET /notifications: worker events (finished, blocked, failed, exited), oldest first
  board: null, // GET /sessions/{name}/board of the session view's session
  hosts: [], // GET /hosts: the cao-servers sharing the store (docs/multi-host.md)
};
const ME = "dashboard"; // who the dashboard acts as (a person, never an agent): on the timeline
const PRIORITIES = ["urgent", "high", "normal", "low"];
let view = null; // the current view's cleanup

// -- HTTP ------------------------------------------------------------------------------------------
async function api(path, options = {}) {
  const init = { ...options, headers: { ...(options.headers || {}) } };
  if (init.json !== undefined) {
    init.method = init.method || "POST";
    init.body = JSON.stringify(init.json);
    init.headers["Content-Type"] = "application/json";
    delete init.json;
  }
  const res = await fetch(path, init);
  const body = res.headers.get("content-type")?.includes("json") ? await res.json() : await res.text();
  if (res.status === 401) showLogin();
  if (!res.ok) throw new Error((body && body.detail) || `${res.status} ${res.statusText}`);
  return body;
}

function toast(text) {
  const el = $("#toast");
  el.textContent = text;
  el.classList.add("show");
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => el.classList.remove("show"), 4000);
}

function showLogin() {
  main.innerHTML = `<div class="login"><h2>Token needed</h2>
    <p>This cao-server requires its API token. Run <code class="mono">cao dashboard</code> in a shell:
    it prints (and with <code class="mono">--open</code> opens) a link that logs this browser in; each link works once, within two minutes.</p></div>`;
}

// -- time and formatting ------------------------------------------------------------------------
const ms = (t) => (t == null ? null : typeof t === "number" ? t * 1000 : Date.parse(t));
function span(s) {
  s = Math.max(0, Math.round(s));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
  return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
}
const ago = (t) => (t == null ? "" : span((Date.now() - t) / 1000));
const clock = (t) => (t == null ? "" : new Date(t).toLocaleTimeString());
// "12:04:05 (in 9m 58s)" or "(3s ago)": a deadline or a deferral, at a glance
const when = (t) => `${esc(clock(t))} <span class="dim">(${t > Date.now() ? `in ${span((t - Date.now()) / 1000)}` : `${ago(t)} ago`})</span>`;
const esc = (s) => String(s ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
const badge = (status, id) => `<span class="badge" data-status="${esc(status)}"${id ? ` data-testid="${esc(id)}"` : ""}>${esc(status)}</span>`;

// -- loading state ------------------------------------------------------------------------------
async function loadTerminals() {
  const list = await api("/terminals");
  const seen = new Set();
  for (const t of list) {
    seen.add(t.id);
    const old = state.terminals.get(t.id);
    if (!old || old.status !== t.status) state.since.set(t.id, old ? Date.now() : ms(t.last_active) ?? Date.now());
    state.terminals.set(t.id, t);
  }
  for (const id of [...state.terminals.keys()]) if (!seen.has(id)) state.terminals.delete(id);
}

// The hosts sharing the store: no event tells of a heartbeat that stopped, so read every few seconds.
async function loadHosts() {
  try {
    state.hosts = await api("/hosts");
  } catch (err) {
    state.hosts = [];
  }
}
const manyHosts = () => state.hosts.length > 1;

async function loadMessages() {
  const list = await api("/messages?limit=500");
  state.messages = new Map(list.map((m) => [m.id, m]));
}

async function loadNotifications() {
  state.notifications = await api("/notifications?limit=30");
}

const debounced = (fn, wait) => {
  let timer = null;
  return () => {
    clearTimeout(timer);
    timer = setTimeout(fn, wait);
  };
};
const refreshTerminals = debounced(() => loadTerminals().then(render).catch(() => {}), 100);
const refreshMessages = debounced(() => loadMessages().then(render).catch(() => {}), 100);
const refreshNotifications = debounced(() => loadNotifications().then(render).catch(() => {}), 100);

// The terminal view's attention panel: its state, its queue in serving order, its timeline.
let attentionSeq = 0;
async function loadAttention(force = false) {
  if (!state.route.startsWith("#/t/")) return;
  const id = state.route.slice(4);
  const seq = ++attentionSeq;
  const a = await api(`/terminals/${encodeURIComponent(id)}/attention?limit=50`);
  if (seq !== attentionSeq || state.route !== `#/t/${id}`) return; // a newer answer, or another view
  const same = !force && state.attention && JSON.stringify(state.attention) === JSON.stringify(a);
  state.attention = a;
  if (!same) renderAttention(); // unchanged: leave the panel (and an open priority select) alone
}
// Coalesced, not debounced: one re-read at most `wait` ms after the first event, however many follow
// (a steady stream of events would starve a debounce, leaving the panel stale while they last).
const coalesced = (fn, wait) => {
  let timer = null;
  return () => {
    if (timer === null) timer = setTimeout(() => {
      timer = null;
      fn();
    }, wait);
  };
};
const refreshAttention = coalesced(() => loadAttention().catch(() => {}), 200);

// The session view's board: the facts its agents share (read once, then again on each board.set).
const sessionOf = (route) => (route.startsWith("#/s/") ? route.slice(4) : null);
const sameSession = (a, b) => a != null && b != null && (a === b || `cao-${a}` === b || a === `cao-${b}`);
let boardSeq = 0;
async function loadBoard() {
  const name = sessionOf(state.route);
  if (name == null) return;
  const seq = ++boardSeq;
  const facts = await api(`/sessions/${encodeURIComponent(name)}/board`);
  if (seq !== boardSeq || sessionOf(state.route) !== name) return; // a newer answer, or another view
  state.board = facts;
  renderBoard();
}
const refreshBoard = coalesced(() => loadBoard().catch((err) => toast(err.message)), 200);

// -- the event stream ---------------------------------------------------------------------------
function connectEvents() {
  const live = $("#live");
  const source = new EventSource("/events");
  source.onopen = () => {
    live.textContent = "live";
    live.className = "live on";
  };
  source.onerror = () => {
    live.textContent = "reconnecting…";
    live.className = "live off";
  };
  source.addEventListener("terminal.status", (e) => {
    const ev = JSON.parse(e.data);
    const t = state.terminals.get(ev.terminal_id);
    if (!t || ev.status === "unknown" || ev.status === "gone") return refreshTerminals();  // with the reason
    t.status = ev.status;
    state.since.set(ev.terminal_id, ev.t * 1000);
    if (state.route === `#/t/${ev.terminal_id}`) refreshAttention(); // idle → working on #n, …
    render();
  });
  // every change of a message (queued, held, deferred, dropped, …): the agent's timeline and queue
  source.addEventListener("timeline", (e) => {
    const ev = JSON.parse(e.data);
    if (state.route === `#/t/${ev.receiver_id}`) refreshAttention();
    refreshMessages(); // a drop, a deferral or an expiry has no message.* event of its own
  });
  for (const type of ["terminal.created", "terminal.gone", "terminal.deleted"]) {
    source.addEventListener(type, () => {
      refreshTerminals();
      refreshMessages();
    });
  }
  for (const type of ["message.queued", "message.claimed", "message.delivered", "message.retried",
    "message.failed", "message.cancelled", "message.waiting"]) {
    source.addEventListener(type, (e) => {
      // queued and delivered are on the agent's timeline too (the stream sends them once, as these)
      const ev = JSON.parse(e.data);
      if (state.route === `#/t/${ev.receiver_id}`) refreshAttention();
      refreshMessages();
    });
  }
  // a worker finished, waits at a prompt, failed or exited (cao/coordination.py): the attention list
  source.addEventListener("notification", () => refreshNotifications());
  // a fact written (or deleted) on a board: the session view showing it re-reads it
  source.addEventListener("board.set", (e) => {
    if (sameSession(sessionOf(state.route), JSON.parse(e.data).session_name)) refreshBoard();
  });
  source.addEventListener("stream.reset", () => {
    refreshTerminals();
    refreshMessages();
    refreshNotifications();
    refreshAttention();
    refreshBoard();
  });
}

// -- views ------------------------------------------------------------------------------------------
function render() {
  if (state.route.startsWith("#/t/")) return renderTerminalSide();
  if (state.route.startsWith("#/s/")) return renderSession();
  if (state.route === "#/messages") return renderMessages();
  return renderFleet();
}

function pendingFor(id) {
  let n = 0;
  for (const m of state.messages.values()) if (m.receiver_id === id && (m.status === "pending" || m.status === "delivering")) n++;
  return n;
}

// A worker with its own git worktree: its branch and, once it has changed something, the diffstat.
function branchCell(t) {
  const wt = t.worktree;
  if (!wt) return "";
  const d = wt.diffstat;
  const stat = d && d.files ? ` <span class="dim" data-testid="diffstat-${esc(t.id)}">${d.files} file${d.files === 1 ? "" : "s"} +${d.insertions} −${d.deletions}</span>` : "";
  return `<span class="mono" title="${esc(wt.path)}">${esc(wt.branch)}</span>${stat}`;
}

function fleetRows() {
  // supervisors first, each followed by its workers (supervisor_id), then the rest
  const all = [...state.terminals.values()];
  const ids = new Set(all.map((t) => t.id));
  const roots = all.filter((t) => !t.supervisor_id || !ids.has(t.supervisor_id));
  const out = [];
  const add = (t, depth) => {
    out.push([t, depth]);
    for (const w of all.filter((x) => x.supervisor_id === t.id)) add(w, depth + 1);
  };
  roots.forEach((t) => add(t, 0));
  return out;
}

function renderFleet() {
  if (!$("#fleet")) {
    main.innerHTML = `
      <h2>New agent</h2>
      <form class="create" id="create">
        <label>provider <select name="provider">${state.providers.map((p) => `<option${p === state.defaultProvider ? " selected" : ""}>${esc(p)}</option>`).join("")}</select></label>
        <label>profile <input name="agent_profile" placeholder="developer" size="14"></label>
        <label>session <input name="session_name" placeholder="(new)" size="14"></label>
        <label id="host-choice" hidden>host <select name="host"></select></label>
        <button type="submit">Create</button>
      </form>
      <h2>Needs attention</h2>
      <div id="needs"></div>
      <div id="hosts-panel"></div>
      <h2>Fleet</h2>
      <div id="fleet"></div>`;
    $("#create").addEventListener("submit", async (e) => {
      e.preventDefault();
      const data = Object.fromEntries(new FormData(e.target));
      for (const k of Object.keys(data)) if (!data[k]) delete data[k];
      const path = data.session_name && [...state.terminals.values()].some((t) => t.session_name === `cao-${data.session_name}` || t.session_name === data.session_name)
        ? `/sessions/${encodeURIComponent(data.session_name)}/terminals` : "/sessions";
      try {
        const t = await api(path, { json: data });
        toast(`created ${t.id}`);
        refreshTerminals();
      } catch (err) {
        toast(err.message);
      }
    });
  }
  renderNeeds();
  renderHosts();
  const rows = fleetRows();
  const hostCol = manyHosts();
  $("#fleet").innerHTML = rows.length === 0 ? `<div class="empty">No agents yet. Create one above, or run <code class="mono">cao launch</code>.</div>` : `
    <table><thead><tr><th>terminal</th>${hostCol ? "<th>host</th>" : ""}<th>session</th><th>provider</th><th>profile</th><th>status</th>
      <th>for</th><th>inbox</th><th>branch</th><th></th></tr></thead><tbody>
    ${rows.map(([t, depth]) => `
      <tr class="${depth ? "worker" : ""}" data-terminal="${esc(t.id)}">
        <td class="mono"><a href="#/t/${esc(t.id)}">${esc(t.id)}</a> <span class="dim">${esc(t.name)}</span></td>
        ${hostCol ? `<td class="mono" data-testid="host-of-${esc(t.id)}">${esc(t.host)}</td>` : ""}
        <td class="mono"><a href="#/s/${esc(t.session_name)}">${esc(t.session_name)}</a></td>
        <td>${esc(t.provider)}</td>
        <td>${esc(t.agent_profile)}</td>
        <td>${badge(t.status, `status-${t.id}`)}${t.status_reason ? `<div class="why">${esc(t.status_reason)}</div>` : ""}</td>
        <td class="dim" data-since="${esc(t.id)}">${ago(state.since.get(t.id))}</td>
        <td>${pendingFor(t.id) || ""}</td>
        <td>${branchCell(t)}</td>
        <td>${t.status === "gone" ? "" : `<button data-act="exit" data-id="${esc(t.id)}">Exit</button>`}
            <button class="danger" data-act="delete" data-id="${esc(t.id)}">Delete</button></td>
      </tr>`).join("")}
    </tbody></table>`;
  for (const b of main.querySelectorAll("button[data-act]")) {
    b.onclick = async () => {
      const id = b.dataset.id;
      try {
        if (b.dataset.act === "exit") await api(`/terminals/${id}/exit`, { method: "POST" });
        else if (confirm(`Delete ${id}? Its agent is stopped and its pending mail fails.`)) await api(`/terminals/${id}`, { method: "DELETE" });
        refreshTerminals();
      } catch (err) {
        toast(err.message);
      }
    };
  }
}

// The hosts panel (only when several cao-servers share the store): alive or not, version,
// heartbeat, agents; the create form's host choice follows it.
function renderHosts() {
  const panel = $("#hosts-panel");
  if (!panel) return;
  const choice = $("#host-choice");
  if (!manyHosts()) {
    panel.innerHTML = "";
    if (choice) choice.hidden = true;
    return;
  }
  if (choice) {
    const select = choice.querySelector("select");
    const picked = select.value;
    select.innerHTML = state.hosts.map((h) => `<option${h.this_host ? " selected" : ""}>${esc(h.name)}</option>`).join("");
    if (picked && state.hosts.some((h) => h.name === picked)) select.value = picked;
    choice.hidden = false;
  }
  panel.innerHTML = `
    <h2>Hosts</h2>
    <table><thead><tr><th>host</th><th>state</th><th>url</th><th>version</th><th>heartbeat</th><th>agents</th></tr></thead><tbody>
    ${state.hosts.map((h) => `
      <tr data-host="${esc(h.name)}">
        <td class="mono">${esc(h.name)}${h.this_host ? ' <span class="dim">(this one)</span>' : ""}</td>
        <td>${badge(h.alive ? "alive" : h.state, `host-${h.name}`)}${h.note ? `<div class="why">${esc(h.note)}</div>` : ""}</td>
        <td class="mono">${esc(h.url)}</td>
        <td>${esc(h.version)}</td>
        <td class="dim">${span(h.heartbeat_age)} ago</td>
        <td>${esc(h.agents)}</td>
      </tr>`).join("")}
    </tbody></table>`;
}

// Who waits for a person now (a prompt, an error, a screen nothing reads) and the latest worker
// events, newest first; each row jumps to its agent.
const NEEDS_NOW = { waiting_user_answer: "waits for a person", error: "failed", unknown: "status unknown" };
const EVENT_WORDS = { blocked: "blocked at a prompt", failed: "failed", finished: "finished", exited: "exited" };
function renderNeeds() {
  const now = [...state.terminals.values()].filter((t) => NEEDS_NOW[t.status]);
  const events = [...state.notifications].reverse().slice(0, 12);
  if (!now.length && !events.length) {
    $("#needs").innerHTML = `<div class="empty" data-testid="needs-empty">Nothing needs you: no agent waits for a person, no worker event yet.</div>`;
    return;
  }
  const hook = (n) => (n.webhook ? `<span class="dim" title="${esc(n.webhook_error || "")}">webhook ${esc(n.webhook)}</span>` : "");
  $("#needs").innerHTML = `<table id="needs-list"><tbody>
    ${now.map((t) => `<tr data-needs="${esc(t.id)}" data-kind="now">
      <td>${badge(t.status)}</td><td class="mono"><a href="#/t/${esc(t.id)}">${esc(t.id)}</a> <span class="dim">${esc(t.agent_profile)}</span></td>
      <td><b>${esc(NEEDS_NOW[t.status])}</b>${t.status_reason ? ` <span class="why">${esc(t.status_reason)}</span>` : ""}</td>
      <td class="dim" data-since="${esc(t.id)}">${ago(state.since.get(t.id))}</td><td></td></tr>`).join("")}
    ${events.map((n) => `<tr data-needs="${esc(n.terminal_id)}" data-kind="event" data-event="${esc(n.event)}">
      <td><span class="badge" data-status="${esc(n.event)}">${esc(n.event)}</span></td>
      <td class="mono"><a href="#/t/${esc(n.terminal_id)}">${esc(n.terminal_id)}</a>${n.supervisor_id ? ` <span class="dim">→ ${esc(n.supervisor_id)}</span>` : ""}</td>
      <td>${esc(EVENT_WORDS[n.event] || n.event)} <span class="why">${esc(n.reason || "")}</span></td>
      <td class="dim" data-ago="${ms(n.at)}">${ago(ms(n.at))}</td><td>${hook(n)}</td></tr>`).join("")}
  </tbody></table>`;
}

function messageRows(list) {
  return list.map((m) => {
    const latency = m.delivered_at ? `${Math.round(ms(m.delivered_at) - ms(m.created_at))} ms` : "";
    const why = m.status === "pending" && m.waiting_reason ? `<div class="why">${esc(m.waiting_reason)}</div>` : "";
    const err = m.last_error && m.status !== "delivered" ? `<div class="err">${esc(m.last_error)}</div>` : "";
    return `<tr data-message="${esc(m.id)}">
      <td class="mono">#${esc(m.id)}</td>
      <td class="dim">${new Date(ms(m.created_at)).toLocaleTimeString()}</td>
      <td class="mono">${esc(m.sender_id)} → <a href="#/t/${esc(m.receiver_id)}">${esc(m.receiver_id)}</a></td>
      <td>${badge(m.status, `message-${m.id}`)}${why}${err}</td>
      <td>${latency}</td>
      <td>${esc(m.attempts)}</td>
      <td class="mono dim">${esc((m.message || "").slice(0, 80))}</td>
      <td>${m.status === "pending" ? `<button data-cancel="${esc(m.id)}">Cancel</button>` : ""}</td>
    </tr>`;
  }).join("");
}

function bindCancel(root) {
  for (const b of root.querySelectorAll("button[data-cancel]")) {
    b.onclick = async () => {
      try {
        await api(`/messages/${b.dataset.cancel}/cancel`, { method: "POST" });
        refreshMessages();
      } catch (err) {
        toast(err.message);
      }
    };
  }
}

function renderMessages() {
  const list = [...state.messages.values()].sort((a, b) => b.id - a.id);
  const pairs = new Map();
  const names = new Set();
  for (const m of list) {
    const key = `${m.sender_id}\u0000${m.receiver_id}`;
    pairs.set(key, (pairs.get(key) || 0) + 1);
    names.add(m.sender_id);
    names.add(m.receiver_id);
  }
  const order = [...names].sort();
  main.innerHTML = `
    <h2>Who talks to whom</h2>
    ${order.length === 0 ? `<div class="empty">No messages yet.</div>` : `
    <table class="matrix"><thead><tr><th>from \\ to</th>${order.map((n) => `<th class="mono">${esc(n)}</th>`).join("")}</tr></thead>
    <tbody>${order.map((s) => `<tr><td class="mono">${esc(s)}</td>${order.map((r) => {
      const n = pairs.get(`${s}\u0000${r}`) || 0;
      return `<td class="n" data-n="${n}">${n}</td>`;
    }).join("")}</tr>`).join("")}</tbody></table>`}
    <h2>Messages</h2>
    ${list.length === 0 ? "" : `<table><thead><tr><th>id</th><th>sent</th><th>sender → receiver</th><th>state</th>
      <th>latency</th><th>attempts</th><th>body</th><th></th></tr></thead><tbody id="messages">${messageRows(list)}</tbody></table>`}`;
  bindCancel(main);
}

function renderTerminalSide() {
  const id = state.route.slice(4);
  const t = state.terminals.get(id);
  const head = $("#term-head");
  if (head) head.innerHTML = t ? `<span class="mono">${esc(t.id)}</span> ${esc(t.name)} · ${esc(t.provider)} · ${badge(t.status, `status-${t.id}`)} <span class="dim">for ${ago(state.since.get(t.id))}</span> · <a class="mono" href="#/s/${esc(t.session_name)}">${esc(t.session_name)}</a>` : "gone";
  const inbox = $("#inbox");
  if (inbox) {
    const list = [...state.messages.values()].filter((m) => m.receiver_id === id || m.sender_id === id).sort((a, b) => b.id - a.id);
    inbox.innerHTML = list.length ? `<table><tbody>${messageRows(list)}</tbody></table>` : `<div class="empty">No messages.</div>`;
    bindCancel(inbox);
  }
}

// -- the attention panel (docs/attention.md) ------------------------------------------------------
function attentionLine(a) {
  const tag = `<span class="badge" data-attention="${esc(a.attention)}">${esc(a.attention)}</span>`;
  if (a.attention !== "working") {
    const why = { "waiting for an answer": "a question or permission prompt is open: answer it on the screen",
      unknown: "the screen can't be read as a known state", gone: "its pane is gone" }[a.attention];
    return `${tag}${why ? ` <span class="dim">${esc(why)}</span>` : ""}`;
  }
  const w = a.working_on;
  const since = w ? ms(w.since) : state.since.get(a.terminal_id);
  const on = w ? ` on <span class="mono">#${esc(w.message_id)}</span> from <span class="mono">${esc(w.sender_id)}</span>` : "";
  const time = since == null || Number.isNaN(since) ? ""
    : ` since ${esc(clock(since))} <span class="dim">(for <span data-ago="${esc(since)}">${ago(since)}</span>)</span>`;
  return `${tag}${time}${on}`;
}

function queueRow(m) {
  const id = esc(m.id);
  const pending = m.status === "pending";
  const prio = pending
    ? `<select data-prioritize="${id}" aria-label="priority of #${id}">${PRIORITIES.map((p) => `<option${p === m.priority ? " selected" : ""}>${esc(p)}</option>`).join("")}</select>`
    : `<span class="prio" data-priority="${esc(m.priority)}">${esc(m.priority)}</span>`;
  const deliverAt = ms(m.deliver_at);
  const due = [
    deliverAt != null && deliverAt > Date.now() ? `not before ${when(deliverAt)}` : "",
    m.expires_at ? `expires ${when(ms(m.expires_at))}` : "",
  ].filter(Boolean).join("<br>");
  return `<tr data-queue="${id}" data-priority="${esc(m.priority)}">
    <td class="mono">#${id}</td>
    <td class="mono">${esc(m.sender_id)}</td>
    <td>${prio}</td>
    <td>${esc(m.kind)}</td>
    <td>${badge(m.status)}${m.waiting_reason ? `<div class="why">${esc(m.waiting_reason)}</div>` : ""}</td>
    <td class="dim">${due}</td>
    <td class="mono dim">${esc((m.message || "").slice(0, 60))}</td>
    <td class="acts">${pending ? `<button data-defer="${id}">Defer 10 min</button> <button class="danger" data-drop="${id}">Drop</button>` : ""}</td>
  </tr>`;
}

function timelineRow(e) {
  return `<tr data-event="${esc(e.event)}" data-message-id="${esc(e.message_id)}">
    <td class="dim">${esc(clock(ms(e.at)))}</td>
    <td>${badge(e.event)}</td>
    <td class="mono">${e.message_id == null ? `<span class="dim">all pending</span>` : `#${esc(e.message_id)}`}</td>
    <td class="mono${e.actor ? "" : " dim"}">${esc(e.actor || "cao")}</td>
    <td>${esc(e.reason)}</td>
  </tr>`;
}

function renderAttention() {
  const box = $("#attention");
  const a = state.attention;
  if (!box || !a) return;
  const events = [...a.timeline].reverse(); // newest first
  box.innerHTML = `
    <div class="attention-state" id="attention-state" data-attention="${esc(a.attention)}">${attentionLine(a)}</div>
    <div class="attention-cols"><div>
    <h3>Queue <span class="dim">in serving order</span></h3>
    ${a.queue.length === 0 ? `<div class="empty">Nothing waiting.</div>` : `
    <table><thead><tr><th>id</th><th>from</th><th>priority</th><th>kind</th><th>state · why it waits</th>
      <th>deadline</th><th>body</th><th></th></tr></thead>
      <tbody id="attention-queue">${a.queue.map(queueRow).join("")}</tbody></table>`}
    </div><div>
    <h3>Timeline <span class="dim">newest first</span></h3>
    ${events.length === 0 ? `<div class="empty">No events yet.</div>` : `
    <div class="timeline"><table><thead><tr><th>time</th><th>event</th><th>message</th><th>by</th><th>reason</th></tr></thead>
      <tbody id="attention-timeline">${events.map(timelineRow).join("")}</tbody></table></div>`}
    </div></div>`;
  bindAttention(box);
}

// The dashboard acts as a person (by: "dashboard"): it may manage any message, a person's chat too.
async function manage(id, action, body, done) {
  try {
    await api(`/messages/${encodeURIComponent(id)}/${action}`, { json: { ...body, by: ME } });
    toast(done);
    loadAttention().catch(() => {});
    refreshMessages();
  } catch (err) {
    toast(err.message);
    loadAttention(true).catch(() => {}); // put the panel back as the server has it (a select's value)
  }
}

function bindAttention(root) {
  for (const b of root.querySelectorAll("button[data-defer]")) {
    b.onclick = () => manage(b.dataset.defer, "defer", { seconds: 600 }, `#${b.dataset.defer} deferred 10 min`);
  }
  for (const b of root.querySelectorAll("button[data-drop]")) {
    b.onclick = () => {
      const reason = prompt(`Drop message #${b.dataset.drop}: why? (required; kept with the message)`);
      if (reason === null) return; // the person changed their mind
      if (!reason.trim()) return toast("a reason is required to drop a message");
      manage(b.dataset.drop, "drop", { reason: reason.trim() }, `#${b.dataset.drop} dropped`);
    };
  }
  for (const sel of root.querySelectorAll("select[data-prioritize]")) {
    sel.onchange = () => manage(sel.dataset.prioritize, "prioritize", { priority: sel.value }, `#${sel.dataset.prioritize} is ${sel.value} now`);
  }
}

// -- the session view: its agents and its board ---------------------------------------------------------
function renderSession() {
  const name = sessionOf(state.route);
  const box = $("#session-terminals");
  if (!box) return;
  const list = [...state.terminals.values()].filter((t) => sameSession(name, t.session_name));
  box.innerHTML = list.length === 0 ? `<div class="empty">No live terminals in this session.</div>` : `
    <table><thead><tr><th>terminal</th><th>profile</th><th>provider</th><th>status</th><th>for</th></tr></thead><tbody>
    ${list.map((t) => `<tr data-terminal="${esc(t.id)}">
      <td class="mono"><a href="#/t/${esc(t.id)}">${esc(t.id)}</a> <span class="dim">${esc(t.name)}</span></td>
      <td>${esc(t.agent_profile)}</td><td>${esc(t.provider)}</td>
      <td>${badge(t.status, `status-${t.id}`)}</td>
      <td class="dim" data-since="${esc(t.id)}">${ago(state.since.get(t.id))}</td></tr>`).join("")}
    </tbody></table>`;
}

const BOARD_VALUE_CHARS = 120; // a value longer than this is cut on screen (the API has it whole)
function boardValue(value) {
  const text = JSON.stringify(value);
  return text.length <= BOARD_VALUE_CHARS ? text : `${text.slice(0, BOARD_VALUE_CHARS - 1)}…`;
}

function boardRow(f) {
  const at = ms(f.at);
  const writer = /^[0-9a-f]{8}$/.test(f.writer) ? `<a href="#/t/${esc(f.writer)}">${esc(f.writer)}</a>` : esc(f.writer);
  return `<tr data-board-key="${esc(f.key)}" data-version="${esc(f.version)}">
    <td class="mono">${esc(f.key)}</td>
    <td class="mono value" title="${esc(JSON.stringify(f.value).slice(0, 2000))}">${esc(boardValue(f.value))}</td>
    <td class="n">${esc(f.version)}</td>
    <td class="mono">${writer}</td>
    <td class="dim"><span data-ago="${esc(at)}">${ago(at)}</span> ago</td>
  </tr>`;
}

function renderBoard() {
  const box = $("#board");
  if (!box || !state.board) return;
  box.innerHTML = state.board.length === 0
    ? `<div class="empty">No facts yet. Agents write them with their <code class="mono">board_set</code> tool; people with <code class="mono">cao board set</code>.</div>`
    : `<table class="board"><thead><tr><th>key</th><th>value</th><th>version</th><th>writer</th><th>age</th></tr></thead>
      <tbody id="board-facts">${state.board.map(boardRow).join("")}</tbody></table>`;
}

function openSession(name) {
  main.innerHTML = `
    <h2 id="session-head">Session <span class="mono">${esc(name)}</span></h2>
    <div id="session-terminals"></div>
    <h2>Board <span class="dim">· facts its agents share; writing one wakes no one</span></h2>
    <div id="board"><div class="empty">Loading…</div></div>`;
  loadBoard().catch((err) => {
    $("#board").innerHTML = `<div class="empty">${esc(err.message)}</div>`;
  });
}

function openTerminal(id) {
  main.innerHTML = `
    <h2 id="term-head"></h2>
    <div class="split">
      <div>
        <div id="term"></div>
        <form class="input" id="input">
          <textarea name="message" placeholder="Type to the agent (sent as one input, neutralised, when it is ready)"></textarea>
          <button type="submit">Send</button>
        </form>
      </div>
      <div><h2>Inbox and sent</h2><div id="inbox"></div></div>
    </div>
    <h2>Attention</h2><div id="attention"><div class="empty">Loading…</div></div>
    <h2>Usage <span class="dim">· tokens and cost from its CLI's own records</span></h2>
    <div id="usage"><div class="empty">Loading…</div></div>
    <h2>Explain <span class="dim">· what decided its status</span>
      <button type="button" id="explain-again">Explain again</button>
      <button type="button" id="explain-copy">Copy as bug report</button></h2>
    <pre id="explain" class="explain" data-testid="explain">Loading…</pre>
    <textarea id="bug-report" class="bug-report" readonly hidden aria-label="bug report"></textarea>`;
  const term = new Terminal({ convertEol: false, disableStdin: true, fontSize: 13, scrollback: 5000 });
  term.open($("#term"));
  const proto = location.protocol === "https:" ? "wss" : "ws";
  const ws = new WebSocket(`${proto}://${location.host}/terminals/${encodeURIComponent(id)}/stream`);
  ws.binaryType = "arraybuffer";
  ws.onmessage = (e) => {
    if (typeof e.data === "string") {
      const msg = JSON.parse(e.data);
      if (msg.type === "hello") term.resize(msg.cols, msg.rows);
      else if (msg.type === "error") term.write(`\r\n[cao: ${msg.detail}]\r\n`);
      return;
    }
    term.write(new Uint8Array(e.data));
  };
  ws.onclose = () => term.write("\r\n\x1b[2m[stream closed]\x1b[0m\r\n");
  $("#input").addEventListener("submit", async (e) => {
    e.preventDefault();
    const box = e.target.elements.message;
    if (!box.value.trim()) return;
    try {
      const r = await api(`/terminals/${encodeURIComponent(id)}/input`, { json: { message: box.value } });
      box.value = "";
      toast(r.confirmed ? "sent" : "typed (not confirmed on screen yet)");
    } catch (err) {
      toast(err.message);
    }
  });
  renderTerminalSide();
  loadAttention().catch((err) => toast(err.message));
  loadExplain(id);
  loadUsage(id);
  $("#explain-again").addEventListener("click", () => loadExplain(id));
  $("#explain-copy").addEventListener("click", () => copyReport(id));
  return () => {
    ws.close();
    term.dispose();
  };
}

// -- explain and usage (docs/providers.md, docs/usage.md): read on demand, never polled -------------
async function loadExplain(id) {
  const box = $("#explain");
  if (!box) return;
  try {
    const ex = await api(`/terminals/${encodeURIComponent(id)}/explain`);
    box.textContent = ex.text; // the screen's text is hostile: never markup
    box.dataset.status = ex.status;
  } catch (err) {
    box.textContent = `explain failed: ${err.message}`;
  }
}

async function copyReport(id) {
  let report;
  try {
    report = (await api(`/terminals/${encodeURIComponent(id)}/explain?report=true`)).bug_report;
  } catch (err) {
    toast(err.message);
    return;
  }
  try {
    if (!navigator.clipboard) throw new Error("no clipboard here");
    await navigator.clipboard.writeText(report);
    toast("bug report copied (home paths, keys and e-mail addresses redacted)");
  } catch {
    // no clipboard (an insecure origin, a denied permission): select it for the person to copy
    const area = $("#bug-report");
    area.hidden = false;
    area.value = report;
    area.focus();
    area.select();
    toast("the clipboard is not available: the report is selected below, copy it with Ctrl+C");
  }
}

const tokens = (n) => (n == null ? "unknown" : Number(n).toLocaleString("en-US"));
const dollars = (v) => (v == null ? "unknown" : `$${Number(v).toFixed(4)}`);

async function loadUsage(id) {
  const box = $("#usage");
  if (!box) return;
  try {
    const u = await api(`/terminals/${encodeURIComponent(id)}/usage`);
    if (!u.known) {
      box.innerHTML = `<div class="empty" data-testid="usage-unknown">unknown: ${esc(u.why)}</div>`;
      return;
    }
    const row = (label, t) => `<tr><td class="mono">${esc(label ?? "-")}</td><td>${tokens(t.input_tokens)}</td>
      <td>${tokens(t.output_tokens)}</td><td>${tokens(t.cache_read_tokens)}</td><td>${tokens(t.cache_write_tokens)}</td>
      <td>${esc(t.responses)}</td><td>${esc(dollars(t.cost_usd))}</td></tr>`;
    box.innerHTML = `<div data-testid="usage-total">${tokens(u.tokens)} tokens · ${esc(dollars(u.cost_usd))} · ${esc(u.responses)} responses</div>
      ${u.budget_hold ? `<div class="warn" data-testid="budget-hold">${esc(u.budget_hold)}</div>` : ""}
      <table><thead><tr><th>task</th><th>input</th><th>output</th><th>cache read</th><th>cache write</th><th>responses</th><th>cost</th></tr></thead>
      <tbody>${u.by_task.map((t) => row(t.task_id, t)).join("")}</tbody></table>`;
  } catch (err) {
    box.innerHTML = `<div class="empty">${esc(err.message)}</div>`;
  }
}

// -- routing ---------------------------------------------------------------------------------------
const TERMINAL_ROUTE = /^#\/t\/[0-9a-f]{8}$/; // an id goes into request paths: nothing else may
const SESSION_ROUTE = /^#\/s\/[A-Za-z0-9][A-Za-z0-9_.-]{0,70}$/; // a session name, likewise

function route() {
  if (view) view();
  view = null;
  state.attention = null;
  state.board = null;
  state.route = location.hash || "#/";
  if (state.route.startsWith("#/t/") && !TERMINAL_ROUTE.test(state.route)) state.route = "#/";
  if (state.route.startsWith("#/s/") && !SESSION_ROUTE.test(state.route)) state.route = "#/";
  for (const a of document.querySelectorAll("nav a")) {
    a.classList.toggle("active", (a.dataset.nav === "messages") === (state.route === "#/messages") && !/^#\/[ts]\//.test(state.route));
  }
  main.innerHTML = "";
  if (state.route.startsWith("#/t/")) view = openTerminal(state.route.slice(4));
  if (state.route.startsWith("#/s/")) openSession(sessionOf(state.route));
  render();
}

async function start() {
  try {
    const health = await api("/health");
    state.providers = health.providers || [];
    state.defaultProvider = health.default_provider || state.defaultProvider;
    await Promise.all([loadTerminals(), loadMessages(), loadNotifications(), loadHosts()]);
  } catch (err) {
    if (!main.querySelector(".login")) toast(err.message);
    return;
  }
  window.addEventListener("hashchange", route);
  route();
  connectEvents();
  setInterval(async () => {
    await loadHosts();
    // other hosts' agents change status without an event here: read them again too
    if (manyHosts()) await loadTerminals().catch(() => {});
    if ($("#fleet")) renderFleet();
  }, 3000);
  setInterval(() => {
    for (const el of document.querySelectorAll("[data-since]")) el.textContent = ago(state.since.get(el.dataset.since));
    for (const el of document.querySelectorAll("[data-ago]")) el.textContent = ago(Number(el.dataset.ago));
  }, 1000);
}

start();
