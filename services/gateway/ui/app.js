// gpusched dashboard: plain JavaScript over the gateway's own API.
//
// Owns: the pages (queues, cluster, jobs, a job) and keeping them live
// from the event stream. Must never: keep the token anywhere but this
// tab's sessionStorage or put it in a URL, build markup from strings (every
// value goes in as text), or guess anything the API does not say.

const TOKEN_KEY = "gpusched.token";
const STATES = ["queued", "admitted", "bound", "running", "preempting",
  "succeeded", "failed", "cancelled", "rejected", "submitted"];
const ENDED = new Set(["succeeded", "failed", "cancelled", "rejected"]);
const LANES = ["pending", "admitted", "bound", "running", "preempting"];

const main = document.getElementById("main");
let me = null; // {admin, tenant} of the token
let stream = null; // AbortController of the live event stream
let refreshTimer = null;
let render = null; // re-renders the current page's data
let cancelNote = null; // {id, text}: the answer to the last cancel sent

// ---- helpers -------------------------------------------------------------

/** An element with attributes and children (strings become text nodes). */
function h(tag, attrs = {}, ...children) {
  const svg = ["svg", "rect", "line", "text", "title", "g"].includes(tag);
  const el = svg
    ? document.createElementNS("http://www.w3.org/2000/svg", tag)
    : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

/** Calls the API with the session's token; JSON in, JSON out. */
async function api(path, options = {}) {
  const headers = { Authorization: `Bearer ${token()}`, Accept: "application/json" };
  const res = await fetch(path, { ...options, headers });
  const body = await res.json().catch(() => null);
  if (res.status === 401) {
    logout("The token was refused; log in again.");
    throw new ApiError(401, "unauthorized");
  }
  if (!res.ok) {
    const msg = body && body.error ? body.error.message : `HTTP ${res.status}`;
    throw new ApiError(res.status, msg);
  }
  return body;
}

function when(ms) {
  if (ms === null || ms === undefined) return "—";
  return new Date(ms).toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
}

function span(ms) {
  if (ms < 10000) return `${(ms / 1000).toFixed(2)} s`;
  const s = Math.round(ms / 1000);
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
}

function params() {
  const [path, query] = location.hash.replace(/^#/, "").split("?");
  return { path: path || "/queues", query: new URLSearchParams(query || "") };
}

function page(title, ...content) {
  main.replaceChildren(h("h2", { id: "page-title" }, title), ...content);
  document.title = `${title} · gpusched`;
}

function showError(where, e) {
  where.replaceChildren(h("p", { class: "error", role: "alert" }, e.message));
}

function table(caption, head, rows, numeric = []) {
  return h("table", {},
    h("caption", {}, caption),
    h("thead", {}, h("tr", {}, head.map((c, i) =>
      h("th", { scope: "col", class: numeric.includes(i) ? "num" : null }, c)))),
    h("tbody", {}, rows.map((r) => h("tr", {}, r.map((c, i) =>
      h("td", { class: numeric.includes(i) ? "num" : null }, c))))));
}

// ---- login ---------------------------------------------------------------

function logout(message) {
  sessionStorage.removeItem(TOKEN_KEY);
  me = null;
  render = null;
  clearTimeout(refreshTimer);
  refreshTimer = null;
  if (stream) stream.abort();
  stream = null;
  login(message);
}

function login(message) {
  document.getElementById("nav").hidden = true;
  document.getElementById("logout").hidden = true;
  document.getElementById("who").textContent = "";
  document.getElementById("live").textContent = "";
  const input = h("input", { id: "token", name: "token", type: "password",
    autocomplete: "current-password", required: true });
  const note = h("p", { id: "login-error", class: "error", role: "alert" }, message || "");
  const form = h("form", { id: "login", onsubmit: async (ev) => {
    ev.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, input.value.trim());
    try {
      await start();
    } catch (e) {
      if (e.status !== 401) note.textContent = e.message;
    }
  } },
  h("label", { for: "token" }, "API token", input),
  h("button", { type: "submit" }, "Log in"));
  page("Log in", h("p", {}, "The token is kept in this tab only (session storage) and sent with each API call."), form, note);
  input.focus();
}

async function start() {
  me = await api("/v1/whoami");
  document.getElementById("who").textContent = me.admin ? "admin" : `tenant ${me.tenant}`;
  document.getElementById("nav").hidden = false;
  document.getElementById("logout").hidden = false;
  follow();
  route();
}

// ---- live updates --------------------------------------------------------

/** Follows `/v1/events` as Server-Sent Events (read with fetch, so the
 * token goes in a header) and refreshes the page shortly after each event. */
async function follow() {
  if (stream) stream.abort();
  const ctl = new AbortController();
  stream = ctl;
  const live = document.getElementById("live");
  let from = null;
  while (!ctl.signal.aborted) {
    try {
      if (from === null) from = (await api("/v1/status")).seq;
      const res = await fetch(`/v1/events?follow=true&from=${from}`, {
        headers: { Authorization: `Bearer ${token()}`, Accept: "text/event-stream" },
        signal: ctl.signal,
      });
      if (res.status === 401) {
        logout("The token was refused; log in again.");
        return;
      }
      if (!res.ok || !res.body) throw new Error(`HTTP ${res.status}`);
      live.textContent = "live";
      const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf = (buf + value).replace(/\r\n?/g, "\n");
        let cut;
        while ((cut = buf.indexOf("\n\n")) >= 0) {
          const frame = buf.slice(0, cut);
          buf = buf.slice(cut + 2);
          const id = frame.split("\n").find((l) => l.startsWith("id:"));
          if (id) {
            from = Number(id.slice(3).trim());
            soon();
          }
        }
      }
    } catch (e) {
      if (ctl.signal.aborted) return;
    }
    live.textContent = "reconnecting…";
    await new Promise((r) => setTimeout(r, 2000));
  }
}

/** Refreshes the current page's data at most twice a second. */
let refreshing = false;
function soon() {
  if (refreshTimer || !me) return;
  refreshTimer = setTimeout(async () => {
    refreshTimer = null;
    // One redraw at a time, and none while a cancel waits for its answer.
    if (!render || refreshing || document.getElementById("cancel-confirm")) return;
    refreshing = true;
    try {
      await render();
    } catch (e) {
      /* the next event or tick tries again */
    } finally {
      refreshing = false;
    }
  }, 500);
}

// ---- pages ---------------------------------------------------------------

async function queuesPage() {
  const body = h("div", { id: "queues" });
  page("Queues", body);
  render = async () => {
    const { queues } = await api("/v1/queues");
    // A GPU-hour budget column only where some tenant has a budget.
    const budgets = queues.some((q) => q.budget);
    const budget = (b) => !b ? "—"
      : `${b.used_gpu_hours.toFixed(1)} of ${b.gpu_hours} GPU-h this ${b.period}` + (b.spent ? ` (spent: ${b.when_spent})` : "");
    const rows = queues.map((q) => [
      q.tenant, q.queue || "open", q.cohort || "—", q.flavor, q.nominal, q.used, q.borrowed, q.lent,
      q.pending, q.running,
      Object.entries(q.pending_by_reason || {}).map(([r, n]) => `${r.replaceAll("_", " ")} ${n}`).join(", ") || "—",
      ...(budgets ? [budget(q.budget)] : []),
    ]);
    body.replaceChildren(table("Quota and use per tenant and flavor (GPUs; jobs for pending and running)",
      ["Tenant", "Queue", "Cohort", "Flavor", "Nominal", "Used", "Borrowed", "Lent", "Pending", "Running", "Pending by reason",
        ...(budgets ? ["Budget"] : [])],
      rows, [4, 5, 6, 7, 8, 9]));
  };
  await render().catch((e) => showError(body, e));
}

function nodeState(n) {
  if (n.status !== "ready") return n.status;
  if (n.reserved_for !== null && n.reserved_for !== undefined) return "reserved";
  if (n.used === 0) return "free";
  return n.used >= n.gpus ? "full" : "used";
}

async function clusterPage() {
  const body = h("div", { id: "cluster" });
  const detail = h("div", { id: "node-detail", class: "panel", "aria-live": "polite", hidden: true });
  const legend = h("div", { class: "legend", "aria-label": "Legend" },
    ["free", "used", "full", "reserved", "cordoned", "drained", "evicted", "lost"].map((s) =>
      h("span", {}, h("span", { class: `swatch s-${s}`, "aria-hidden": "true" }), s)));
  page("Cluster", legend, body, detail);
  let selected = null;
  const showNode = (n) => {
    selected = n.name;
    detail.hidden = false;
    detail.replaceChildren(
      h("h3", {}, `Node ${n.name}`),
      h("dl", { class: "facts" },
        h("dt", {}, "State"), h("dd", {}, nodeState(n)),
        h("dt", {}, "Flavor"), h("dd", {}, n.flavor),
        h("dt", {}, "Place"), h("dd", {}, n.path.join(" / ")),
        h("dt", {}, "GPUs used"), h("dd", {}, `${n.used} of ${n.gpus}`),
        h("dt", {}, "Reserved for"), h("dd", {}, n.reserved_for
          ? h("a", { href: `#/jobs/${n.reserved_for}` }, `job ${n.reserved_for}`) : "—")),
      n.jobs.length
        ? h("ul", { "aria-label": `Jobs on ${n.name}` },
          n.jobs.map((j) => h("li", {}, h("a", { href: `#/jobs/${j}` }, `job ${j}`))))
        : h("p", {}, "No job holds GPUs on it."));
  };
  render = async () => {
    const { nodes } = await api("/v1/nodes");
    // Group by flavor and the outermost level (rack), then by the rest of
    // the path (block): a gang is placed inside one flavor's domains.
    const racks = new Map();
    for (const n of nodes) {
      const rack = `${n.flavor} · ${n.path[0] || "—"}`;
      const block = n.path.slice(1).join(" / ") || "—";
      if (!racks.has(rack)) racks.set(rack, new Map());
      const blocks = racks.get(rack);
      if (!blocks.has(block)) blocks.set(block, []);
      blocks.get(block).push(n);
    }
    const counts = {};
    for (const n of nodes) counts[nodeState(n)] = (counts[nodeState(n)] || 0) + 1;
    body.replaceChildren(
      h("p", {}, `${nodes.length} nodes: ` + Object.entries(counts).map(([s, c]) => `${c} ${s}`).join(", ")),
      ...[...racks].map(([rack, blocks]) => h("section", { class: "rack", "aria-label": `Rack ${rack}` },
        h("h3", {}, rack),
        ...[...blocks].map(([block, ns]) => h("div", { class: "block" },
          h("h4", {}, block),
          h("div", { class: "cells", role: "group", "aria-label": `${rack} / ${block}` },
            ns.map((n) => h("button", {
              type: "button", class: `cell s-${nodeState(n)}`, "data-node": n.name,
              "aria-label": `${n.name}: ${nodeState(n)}, ${n.used} of ${n.gpus} GPUs used`,
              title: `${n.name}: ${nodeState(n)}, ${n.used}/${n.gpus} GPUs`,
              onclick: () => showNode(n),
            }))))))));
    const again = nodes.find((n) => n.name === selected);
    if (again) showNode(again);
  };
  await render().catch((e) => showError(body, e));
}

async function jobsPage(query) {
  const tenant = me.admin ? query.get("tenant") || "" : me.tenant;
  const state = query.get("state") || "";
  const tenantInput = h("input", { id: "f-tenant", name: "tenant", value: tenant,
    disabled: !me.admin, list: "tenants" });
  const stateSelect = h("select", { id: "f-state", name: "state" },
    h("option", { value: "" }, "any"),
    h("option", { value: "queued,admitted" }, "waiting (queued or admitted)"),
    STATES.map((s) => h("option", { value: s }, s)));
  stateSelect.value = state;
  const form = h("form", { class: "filters", id: "job-filters", onsubmit: (ev) => {
    ev.preventDefault();
    const q = new URLSearchParams();
    if (me.admin && tenantInput.value.trim()) q.set("tenant", tenantInput.value.trim());
    if (stateSelect.value) q.set("state", stateSelect.value);
    location.hash = `#/jobs?${q}`;
  } },
  h("label", { for: "f-tenant" }, "Tenant", tenantInput),
  h("label", { for: "f-state" }, "State", stateSelect),
  h("button", { type: "submit" }, "Filter"),
  h("datalist", { id: "tenants" }));
  const body = h("div", { id: "jobs" });
  page("Jobs", form, body);
  api("/v1/queues").then(({ queues }) => {
    const names = [...new Set(queues.map((q) => q.tenant))];
    form.querySelector("datalist").replaceChildren(...names.map((n) => h("option", { value: n })));
  }).catch(() => {});
  const cursor = query.get("cursor");
  render = async () => {
    // Newest first: what was just submitted is what one looks for.
    const q = new URLSearchParams({ limit: "200", order: "desc" });
    if (tenant) q.set("tenant", tenant);
    if (state) q.set("state", state);
    if (cursor) q.set("cursor", cursor);
    const { jobs, next_cursor } = await api(`/v1/jobs?${q}`);
    const older = new URLSearchParams(query);
    if (next_cursor) older.set("cursor", next_cursor);
    const rows = jobs.map((j) => [
      h("a", { href: `#/jobs/${j.id}` }, `job ${j.id}`),
      j.tenant, j.state, j.gpus, j.flavor || "—",
      j.queue_position ? `${j.queue_position.position} of ${j.queue_position.of}` : "—",
      j.reason || "—",
    ]);
    body.replaceChildren(
      table(`${jobs.length} jobs, newest first${cursor ? `, below job ${cursor}` : ""}`,
        ["Job", "Tenant", "State", "GPUs", "Flavor", "Queue position", "Why it waits"], rows, [3]),
      cursor ? h("a", { href: "#/jobs?" + new URLSearchParams([...query].filter(([k]) => k !== "cursor")) }, "Newest jobs") : null,
      " ",
      next_cursor ? h("a", { href: `#/jobs?${older}`, id: "older" }, "Older jobs →") : null);
  };
  await render().catch((e) => showError(body, e));
}

function gantt(view, now) {
  const W = 1000;
  const left = 90;
  const row = 22;
  const top = 10;
  const bars = view.bars;
  const t0 = bars.length ? bars[0].from_ms : now;
  // Up to now while the job is in some state; up to its end once it ended.
  const open = bars.length && bars[bars.length - 1].to_ms === null;
  const t1 = Math.max(open ? now : t0, ...bars.map((b) => b.to_ms || b.from_ms),
    ...view.marks.map((m) => m.at_ms));
  const scale = (t) => left + ((t - t0) / Math.max(1, t1 - t0)) * (W - left - 10);
  const H = top + LANES.length * row + 30;
  return h("svg", { class: "gantt", viewBox: `0 0 ${W} ${H}`, role: "img",
    "aria-label": `Timeline of job ${view.id}: ${bars.length} spans, ${view.marks.length} marks` },
  LANES.map((lane, i) => h("text", { x: 4, y: top + i * row + 15 }, lane)),
  bars.map((b) => {
    const x = scale(b.from_ms);
    const w = Math.max(2, scale(b.to_ms === null ? now : b.to_ms) - x);
    return h("rect", { class: `l-${b.state}`, x, y: top + LANES.indexOf(b.state) * row + 3,
      width: w, height: row - 6, "data-state": b.state },
    h("title", {}, `${b.state}: ${b.text}`));
  }),
  view.marks.map((m) => h("line", { class: "mark", x1: scale(m.at_ms), x2: scale(m.at_ms),
    y1: top, y2: top + LANES.length * row, "data-kind": m.kind }, h("title", {}, m.text))),
  h("text", { x: left, y: H - 8 }, when(t0)),
  h("text", { x: W - 10, y: H - 8, "text-anchor": "end" }, `${when(t1)} (+${span(t1 - t0)})`));
}

async function jobPage(id) {
  const body = h("div", { id: "job" });
  page(`Job ${id}`, body);
  render = async () => {
    const [job, timeline, explain] = await Promise.all([
      api(`/v1/jobs/${id}`), api(`/v1/jobs/${id}/timeline`), api(`/v1/jobs/${id}/explain`)]);
    const now = Date.now();
    const cancel = h("div", { id: "cancel" });
    if (cancelNote && cancelNote.id === id) {
      cancel.append(h("p", { role: "status" }, cancelNote.text));
    } else if (!ENDED.has(job.state) && !job.cancel_requested) {
      const ask = h("button", { type: "button", id: "cancel-job", onclick: () => {
        ask.hidden = true;
        cancel.append(
          h("button", { type: "button", id: "cancel-confirm", onclick: async () => {
            try {
              const r = await api(`/v1/jobs/${id}`, { method: "DELETE" });
              cancelNote = { id, text: `Cancel recorded (log sequence ${r.seq}); the job is ${r.state}.` };
              cancel.replaceChildren(h("p", { role: "status" }, cancelNote.text));
              soon();
            } catch (e) {
              showError(cancel, e);
            }
          } }, `Yes, cancel job ${id}`),
          h("button", { type: "button", onclick: () => { render(); } }, "Keep it"));
        cancel.querySelector("#cancel-confirm").focus();
      } }, "Cancel job…");
      cancel.append(ask);
    }
    const pending = explain.pending ? explain.pending.text : null;
    body.replaceChildren(
      h("dl", { class: "facts" },
        h("dt", {}, "State"), h("dd", { id: "job-state" }, job.state + (job.cancel_requested ? " (cancel requested)" : "")),
        h("dt", {}, "Tenant"), h("dd", {}, job.tenant),
        h("dt", {}, "GPUs"), h("dd", {}, `${job.spec.workers} × ${job.spec.gpus_per_worker} = ${job.gpus}`),
        h("dt", {}, "Flavor"), h("dd", {}, job.flavor || "—"),
        h("dt", {}, "Nodes"), h("dd", {}, job.nodes.length ? job.nodes.join(", ") : "—"),
        h("dt", {}, "Submitted"), h("dd", {}, when(job.submitted_at_ms)),
        h("dt", {}, "Why it waits"), h("dd", {}, pending || "—"),
        h("dt", {}, "Queue position"), h("dd", {}, explain.queue_position
          ? `${explain.queue_position.position} of ${explain.queue_position.of}` : "—"),
        h("dt", {}, "Guaranteed start"), h("dd", {}, explain.guaranteed_start_ms
          ? when(explain.guaranteed_start_ms) : "none (only a reservation guarantees one)")),
      cancel,
      h("h3", {}, "Timeline"),
      gantt(timeline, now),
      table("Spans", ["State", "From", "To", "Lasted", "Why", "Nodes"],
        timeline.bars.map((b) => [b.state, when(b.from_ms), b.to_ms === null ? "now" : when(b.to_ms),
          span((b.to_ms === null ? now : b.to_ms) - b.from_ms), b.text, b.nodes.join(", ") || "—"])),
      table("Marks", ["At", "What"], timeline.marks.map((m) => [when(m.at_ms), m.text])),
      h("h3", {}, "Explain"),
      h("pre", { class: "explain", id: "explain" }, explain.history.join("\n")));
  };
  await render().catch((e) => showError(body, e));
}

// ---- routing -------------------------------------------------------------

async function route() {
  if (!me) return;
  render = null;
  const { path, query } = params();
  for (const a of document.querySelectorAll("nav a")) {
    const on = path.startsWith(a.getAttribute("href").slice(1));
    if (on) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  const job = path.match(/^\/jobs\/(\d+)$/);
  if (job) await jobPage(job[1]);
  else if (path === "/cluster") await clusterPage();
  else if (path === "/jobs") await jobsPage(query);
  else await queuesPage();
  main.focus({ preventScroll: true });
}

window.addEventListener("hashchange", route);
document.querySelector(".skip").addEventListener("click", (ev) => {
  ev.preventDefault(); // a hash link would be taken for a page
  main.focus();
});
document.getElementById("logout").addEventListener("click", () => logout("Logged out."));
setInterval(soon, 10000); // what the stream does not show a tenant (others' use)
if (token()) start().catch((e) => { if (e.status !== 401) login(e.message); });
else login();
