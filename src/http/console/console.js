// holdfast console: a client of the JSON API (/v1/...), no framework, no build step.
// Everything shown is built with textContent (never innerHTML from data). The API key, when
// the coordinator asks for one, lives in sessionStorage and goes only into the authorization
// header. The console never reserves, so it never receives a hold token; it would not show one.
"use strict";

const KEY = "holdfast.key";
const STATES = ["TRYING", "HELD", "CONFIRMING", "CONFIRMED", "CANCELLING", "CANCELLED",
  "EXPIRED", "REJECTED", "FAILED", "QUEUED"];
const TERMINAL = ["CONFIRMED", "CANCELLED", "EXPIRED", "REJECTED", "FAILED"];
// Only these count down to expires_at: a decided reservation (CONFIRMING, CANCELLING) no
// longer lapses, whatever its expires_at says.
const COUNTING = ["TRYING", "HELD"];
const main = document.getElementById("main");
let cleanup = []; // stops timers and streams of the current view

// ---------- small helpers ----------

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

// replaceChildren with el()'s rules: nested arrays flattened, null and false left out (the
// DOM method itself would write "null").
function fill(node, ...children) {
  const keep = children.flat(2).filter((c) => c !== null && c !== undefined && c !== false);
  node.replaceChildren(...keep);
  return node;
}

function badge(state) {
  return el("span", { class: "badge s-" + state, text: state || "-" });
}

function when(iso) {
  if (!iso) return "-";
  const d = new Date(iso);
  return d.toLocaleString();
}

function remaining(iso) {
  const ms = new Date(iso).getTime() - Date.now();
  if (!(ms > 0)) return "0:00";
  const s = Math.ceil(ms / 1000);
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), sec = s % 60;
  const two = (n) => String(n).padStart(2, "0");
  return h > 0 ? `${h}:${two(m)}:${two(sec)}` : `${m}:${two(sec)}`;
}

function flash(text, bad) {
  const f = document.getElementById("flash");
  f.textContent = text;
  f.classList.toggle("bad", !!bad);
  f.classList.remove("hidden");
}

function clearFlash() {
  document.getElementById("flash").classList.add("hidden");
}

// ---------- the API ----------

class ApiError extends Error {
  constructor(status, body) {
    super((body && body.message) || ("HTTP " + status));
    this.status = status;
    this.body = body || {};
  }
}

function headers(extra) {
  const h = Object.assign({ accept: "application/json" }, extra || {});
  const key = sessionStorage.getItem(KEY);
  if (key) h.authorization = "Bearer " + key;
  return h;
}

async function api(method, path, body) {
  const init = { method, headers: headers(body ? { "content-type": "application/json" } : {}) };
  if (body) init.body = JSON.stringify(body);
  const res = await fetch(path, init);
  const text = await res.text();
  let json = null;
  try { json = text ? JSON.parse(text) : null; } catch (_) { json = null; }
  if (!res.ok) {
    const err = new ApiError(res.status, json);
    if (res.status === 401) askForKey(err.message);
    throw err;
  }
  return json;
}

function describe(err) {
  if (err instanceof ApiError) {
    const reason = err.body.reason ? ` (${err.body.reason})` : "";
    return `${err.body.code || err.status}${reason}: ${err.message}`;
  }
  return String(err);
}

function askForKey(message) {
  document.getElementById("key-panel").classList.remove("hidden");
  document.getElementById("key-error").textContent =
    sessionStorage.getItem(KEY) ? "The key was refused: " + message : "";
  main.replaceChildren();
}

document.getElementById("key-form").addEventListener("submit", (e) => {
  e.preventDefault();
  const input = document.getElementById("key-input");
  sessionStorage.setItem(KEY, input.value.trim());
  input.value = "";
  document.getElementById("key-panel").classList.add("hidden");
  document.getElementById("forget-key").classList.remove("hidden");
  route();
});

document.getElementById("forget-key").addEventListener("click", () => {
  sessionStorage.removeItem(KEY);
  document.getElementById("forget-key").classList.add("hidden");
  route();
});

// ---------- Watch (server-sent events over fetch, so the key travels in a header) ----------

function watch(id, onReservation, onStatus) {
  const controller = new AbortController();
  let stopped = false;
  (async () => {
    try {
      const res = await fetch(`/v1/reservations/${encodeURIComponent(id)}:watch`,
        { headers: headers({ accept: "text/event-stream" }), signal: controller.signal });
      if (!res.ok) { onStatus("not live: HTTP " + res.status); return; }
      onStatus("live");
      const reader = res.body.getReader();
      const decoder = new TextDecoder();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, { stream: true });
        let cut;
        while ((cut = buffer.indexOf("\n\n")) >= 0) {
          const block = buffer.slice(0, cut);
          buffer = buffer.slice(cut + 2);
          let name = "", data = "";
          for (const line of block.split("\n")) {
            if (line.startsWith("event: ")) name = line.slice(7);
            else if (line.startsWith("data: ")) data += line.slice(6);
          }
          if (name === "reservation") onReservation(JSON.parse(data));
          else if (name === "end") onStatus("ended");
          else if (name === "error") onStatus("stream error: " + JSON.parse(data).message);
        }
      }
      if (!stopped) onStatus("ended");
    } catch (e) {
      if (!stopped) onStatus("not live: " + e);
    }
  })();
  return () => { stopped = true; controller.abort(); };
}

// ---------- the event feed (server-sent events over fetch, resumed after the last id) ----------

// Calls onEvent with each event after `after`, live; on a dropped stream (the coordinator
// restarting or shutting down) subscribes again after the last id it read, waiting a little
// longer each time. Heartbeats only move that id. Returns the function that stops it.
function followEvents(after, onEvent, onStatus) {
  const controller = new AbortController();
  let stopped = false;
  let last = after;
  (async () => {
    let wait = 500;
    while (!stopped) {
      try {
        const res = await fetch(`/v1/events:stream?after=${last}`,
          { headers: headers({ accept: "text/event-stream" }), signal: controller.signal });
        if (res.status === 401) { askForKey("HTTP 401"); return; }
        if (!res.ok) { onStatus("not live: HTTP " + res.status); return; }
        onStatus("live");
        wait = 500;
        const reader = res.body.getReader();
        const decoder = new TextDecoder();
        let buffer = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buffer += decoder.decode(value, { stream: true });
          let cut;
          while ((cut = buffer.indexOf("\n\n")) >= 0) {
            const block = buffer.slice(0, cut);
            buffer = buffer.slice(cut + 2);
            let id = null, name = "", data = "";
            for (const line of block.split("\n")) {
              if (line.startsWith("id: ")) id = Number(line.slice(4));
              else if (line.startsWith("event: ")) name = line.slice(7);
              else if (line.startsWith("data: ")) data += line.slice(6);
            }
            if (id !== null && id > last) last = id;
            if (name === "error") onStatus("stream error: " + JSON.parse(data).message);
            else if (name && name !== "HEARTBEAT") onEvent(JSON.parse(data));
          }
        }
      } catch (e) {
        if (stopped) return;
      }
      if (stopped) return;
      onStatus("reconnecting…");
      await new Promise((r) => setTimeout(r, wait));
      wait = Math.min(wait * 2, 5000);
    }
  })();
  return () => { stopped = true; controller.abort(); };
}

// ---------- views ----------

// A table's one row when it has nothing to show, saying so.
function emptyRow(columns, text) {
  return el("tr", { class: "empty" }, el("td", { colspan: String(columns), class: "muted", text }));
}

function stat(label, value, cls, state) {
  return el("div", { class: "stat", "data-state": state }, el("div", { class: "label", text: label }),
    el("div", { class: "value " + (cls || ""), text: String(value) }));
}

// A reservation's link, its full id shown (wrapped on narrow screens, so its tail is never cut).
function idLink(id) {
  return el("a", { class: "mono id", href: "#/r/" + id, text: id });
}

function reservationTable(list, id, empty) {
  const rows = list.map((r) => el("tr", { "data-id": r.id },
    el("td", {}, idLink(r.id)),
    el("td", { text: r.holder }),
    el("td", {}, badge(r.state)),
    el("td", { class: "hide-narrow", text: r.branches.map((b) => `${b.participant}/${b.resource}`).join(", ") }),
    el("td", { class: "hide-narrow", text: when(r.created_at) }),
    el("td", { text: COUNTING.includes(r.state) ? when(r.expires_at) : "-" })));
  return el("div", { class: "table-wrap" }, el("table", { id },
    el("thead", {}, el("tr", {}, ["id", "holder", "state", "holds", "created", "expires"].map((h, i) =>
      el("th", { class: i === 3 || i === 4 ? "hide-narrow" : "", text: h })))),
    el("tbody", {}, rows.length ? rows : emptyRow(6, empty || "No reservations."))));
}

async function reservations(params) {
  const holder = params.get("holder") || "", state = params.get("state") || "";
  const participant = params.get("participant") || "";
  const form = el("form", { class: "filters", id: "filters" },
    el("label", {}, "Holder", el("input", { name: "holder", value: holder })),
    el("label", {}, "State", el("select", { name: "state" },
      el("option", { value: "", text: "any" }),
      STATES.map((s) => el("option", { value: s, text: s, selected: s === state })))),
    el("label", {}, "Participant", el("input", { name: "participant", value: participant })),
    el("button", { type: "submit", text: "Filter" }));
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const q = new URLSearchParams();
    for (const [k, v] of new FormData(form)) if (v) q.set(k, v);
    location.hash = "#/reservations?" + q.toString();
  });
  main.replaceChildren(el("h1", { text: "Reservations" }), form, el("p", { class: "muted", text: "Loading…" }));
  const q = new URLSearchParams();
  for (const k of ["holder", "state", "participant", "page_token"]) if (params.get(k)) q.set(k, params.get(k));
  q.set("page_size", "25");
  const page = await api("GET", "/v1/reservations?" + q.toString());
  const next = new URLSearchParams(params);
  next.set("page_token", page.next_page_token);
  main.replaceChildren(el("h1", { text: "Reservations" }), form,
    reservationTable(page.reservations, "reservations"),
    el("p", { class: "row" },
      params.get("page_token") ? el("a", { href: "#/reservations", text: "First page" }) : null,
      page.next_page_token ? el("a", { id: "next-page", href: "#/reservations?" + next.toString(), text: "Next page →" }) : null));
  const timer = setInterval(async () => {
    if (params.get("page_token")) return;
    try {
      const fresh = await api("GET", "/v1/reservations?" + q.toString());
      const table = document.getElementById("reservations");
      if (table) table.parentNode.replaceWith(reservationTable(fresh.reservations, "reservations"));
    } catch (_) { /* shown on the next navigation */ }
  }, 3000);
  cleanup.push(() => clearInterval(timer));
}

function actionForm(title, explain, fields, confirmText, run, danger) {
  const reason = el("textarea", { name: "reason", required: true, maxlength: "256", placeholder: "Why (recorded in the audit log)" });
  const box = el("div", { class: "confirm-box hidden" });
  const go = el("button", { type: "submit", class: danger ? "danger" : "", text: title + "…" });
  const form = el("form", { class: "card action", "data-action": title },
    el("h2", { text: title }), el("p", { class: "muted", text: explain }),
    fields, el("label", {}, "Reason", reason), el("div", { class: "row" }, go), box);
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    if (!reason.value.trim()) { reason.focus(); return; }
    const yes = el("button", { type: "button", class: danger ? "danger confirm" : "confirm", text: "Yes, " + title.toLowerCase() });
    const no = el("button", { type: "button", class: "secondary", text: "No" });
    box.replaceChildren(el("p", { text: confirmText }), el("div", { class: "row" }, yes, no));
    box.classList.remove("hidden");
    go.disabled = true;
    no.addEventListener("click", () => { box.classList.add("hidden"); go.disabled = false; });
    yes.addEventListener("click", async () => {
      yes.disabled = true;
      try {
        await run(reason.value.trim(), form);
        flash(title + " done.");
        route();
      } catch (err) {
        flash(title + " refused: " + describe(err), true);
        box.classList.add("hidden");
        go.disabled = false;
      }
    });
  });
  return form;
}

function renderReservation(r, parts) {
  parts.state.replaceChildren(badge(r.state));
  parts.state.setAttribute("data-state", r.state);
  parts.expires = r.expires_at;
  parts.terminal = TERMINAL.includes(r.state);
  parts.counting = COUNTING.includes(r.state);
  parts.waitsUntil = r.queue ? r.queue.until : null;
  fill(parts.details, 
    el("dt", { text: "Holder" }), el("dd", { text: r.holder }),
    el("dt", { text: "Request id" }), el("dd", { class: "mono", text: r.request_id }),
    el("dt", { text: "Created" }), el("dd", { text: when(r.created_at) }),
    el("dt", { text: "Expires" }), el("dd", { text: r.state === "QUEUED" ? "- (queued: nothing is held)" : when(r.expires_at) }), queueDetails(r),
    el("dt", { text: "Extensions" }), el("dd", { text: String(r.extensions_used) }),
    el("dt", { text: "Late payment honoured" }), el("dd", { text: r.late_payment_honored ? "yes" : "no" }),
    r.rejection ? [el("dt", { text: "Rejected by" }), el("dd", { text: `${r.rejection.participant}/${r.rejection.resource}: ${r.rejection.reason}` })] : null,
    Object.keys(r.labels || {}).length ? [el("dt", { text: "Labels" }), el("dd", { text: Object.entries(r.labels).map(([k, v]) => `${k}=${v}`).join(", ") })] : null);
  fill(parts.branches, r.branches.length ? r.branches.map((b) => el("tr", {},
    el("td", { text: b.participant }), el("td", { class: "mono", text: b.resource }),
    el("td", { text: String(b.quantity) }), el("td", {}, badge(b.state)),
    el("td", { text: String(b.attempts) }), el("td", { class: "err", text: b.last_error || "" })))
    : emptyRow(6, "No branches."));
  fill(parts.refund, r.refund
    ? el("dl", { class: "kv" },
      el("dt", { text: "Refund" }), el("dd", { class: "mono", text: r.refund.refund_id }),
      el("dt", { text: "State" }), el("dd", {}, badge(r.refund.state)),
      el("dt", { text: "Amount" }), el("dd", { text: `${r.refund.amount_minor} ${r.refund.currency} (minor units)` }),
      r.refund.failure_reason ? [el("dt", { text: "Failure" }), el("dd", { class: "error", text: r.refund.failure_reason })] : null)
    : el("p", { class: "muted", text: "No refund." }));
  fill(parts.payments, r.payments.length
    ? r.payments.map((p) => el("tr", { class: "payment", "data-ref": p.payment_ref, "data-state": p.state },
      el("td", { class: "mono", text: p.payment_ref }), el("td", { text: p.participant }),
      el("td", { text: `${p.amount_minor} ${p.currency}` }), el("td", {}, badge(p.state)),
      el("td", { class: "mono", text: p.refund_id || "-" })))
    : emptyRow(5, "No payment recorded."));
  fill(parts.audit, ...(r.audit.length ? r.audit.map((a) => el("li", { class: "audit-entry" },
    el("strong", { text: a.action }), ` by ${a.principal || "(anonymous)"} at ${when(a.at)}: `,
    el("span", { class: "reason", text: a.reason }), a.participant ? ` (participant ${a.participant})` : ""))
    : [el("li", { class: "muted", text: "No operator actions." })]));
  const can = {
    force: r.state === "TRYING" || r.state === "HELD",
    resolve: r.state === "FAILED",
    retry: !TERMINAL.includes(r.state) || (r.refund && r.refund.state === "PENDING"),
  };
  for (const [k, form] of Object.entries(parts.actions)) form.classList.toggle("hidden", !can[k]);
  parts.noActions.classList.toggle("hidden", can.force || can.resolve || can.retry);
  tick(parts);
}

function tick(parts) {
  if (parts.waitsUntil) {
    parts.countdownLabel.textContent = "wait ends in";
    parts.countdown.textContent = remaining(parts.waitsUntil);
  } else if (!parts.counting || !parts.expires) {
    parts.countdownLabel.textContent = parts.terminal ? "hold over" : parts.counting ? "" : "decided, no expiry";
    parts.countdown.textContent = parts.counting ? "-" : "";
  } else {
    parts.countdownLabel.textContent = "expires in";
    parts.countdown.textContent = remaining(parts.expires);
  }
}

async function reservation(id) {
  const r = await api("GET", "/v1/reservations/" + encodeURIComponent(id));
  const parts = {
    state: el("span", { id: "state" }),
    countdown: el("span", { id: "countdown", class: "countdown" }),
    countdownLabel: el("span", { class: "muted" }),
    live: el("span", { id: "live", class: "live", text: "connecting…" }),
    details: el("dl", { class: "kv", id: "details" }),
    branches: el("tbody", { id: "branches" }),
    refund: el("div", { id: "refund" }),
    payments: el("tbody", { id: "payments" }),
    audit: el("ul", { id: "audit" }),
    noActions: el("p", { class: "muted", text: "No operator action applies to this state." }),
  };
  const reasonFor = (path, body) => (reason) => api("POST", path, Object.assign({ reason }, body || {}));
  const outcome = el("select", { name: "outcome" },
    el("option", { value: "CANCELLED", text: "CANCELLED (release, refund any payment)" }),
    el("option", { value: "CONFIRMED", text: "CONFIRMED" }));
  parts.actions = {
    force: actionForm("Force cancel", "Release this reservation without its hold token.", null,
      `Release reservation ${id} now? The holder's token stops working.`,
      reasonFor(`/v1/admin/reservations/${encodeURIComponent(id)}:force-cancel`), true),
    resolve: actionForm("Resolve", "Settle a FAILED reservation after checking the participants.",
      el("label", {}, "Outcome", outcome), `Settle reservation ${id}?`,
      (reason) => api("POST", `/v1/admin/reservations/${encodeURIComponent(id)}:resolve`, { reason, outcome: outcome.value }), true),
    retry: actionForm("Retry", "Drive this reservation now (clears its backoff).", null,
      `Drive reservation ${id} now?`, () => api("POST", "/v1/admin/retry", { reservation_id: id }), false),
  };
  main.replaceChildren(
    el("p", {}, el("a", { href: "#/reservations", text: "← Reservations" })),
    el("h1", {}, "Reservation ", el("span", { class: "mono", text: id })),
    el("div", { class: "card" }, el("div", { class: "row" }, parts.state, parts.countdownLabel, parts.countdown, parts.live),
      parts.details),
    el("div", { class: "card" }, el("h2", { text: "Branches" }), el("div", { class: "table-wrap" }, el("table", {},
      el("thead", {}, el("tr", {}, ["participant", "resource", "qty", "state", "attempts", "last error"].map((h) => el("th", { text: h })))),
      parts.branches))),
    el("div", { class: "card" }, el("h2", { text: "Payments" }),
      el("p", { class: "muted", text: "Every payment a Confirm cited, oldest first: the one applied, then each further one (refunded)." }),
      el("div", { class: "table-wrap" }, el("table", {},
        el("thead", {}, el("tr", {}, ["payment", "participant", "amount (minor units)", "state", "refund id"].map((h) => el("th", { text: h })))),
        parts.payments))),
    el("div", { class: "card" }, el("h2", { text: "Refund" }), parts.refund),
    el("div", { class: "card" }, el("h2", { text: "Audit" }), parts.audit),
    el("h2", { text: "Operator actions" }), parts.noActions,
    el("div", { class: "actions" }, Object.values(parts.actions)));
  renderReservation(r, parts);
  const timer = setInterval(() => tick(parts), 250);
  cleanup.push(() => clearInterval(timer));
  if (!TERMINAL.includes(r.state)) {
    cleanup.push(watch(id, followQueue(id, parts), (status) => {
      parts.live.textContent = status;
      parts.live.classList.toggle("on", status === "live");
    }));
  } else {
    parts.live.textContent = "";
  }
}

async function participants() {
  main.replaceChildren(el("h1", { text: "Participants" }), el("p", { class: "muted", text: "Checking health…" }));
  const [list, stuck] = await Promise.all([
    api("GET", "/v1/admin/participants").then((r) => r.participants),
    api("GET", "/v1/admin/stuck?page_size=100"),
  ]);
  // The backlog: stuck reservations with a branch still waiting on the participant (its hold
  // not yet settled), from the oldest 100 stuck ("+" when there are more).
  const waiting = new Map();
  for (const r of stuck.reservations) {
    const at = new Set(r.branches.filter((b) => b.state === "PENDING" || b.state === "HELD").map((b) => b.participant));
    for (const name of at) waiting.set(name, (waiting.get(name) || 0) + 1);
  }
  const backlog = (name) => String(waiting.get(name) || 0) + (stuck.next_page_token && waiting.get(name) ? "+" : "");
  const rows = list.map((p) => {
    const retry = el("button", { type: "button", class: "secondary", text: "Retry its backlog" });
    retry.addEventListener("click", async () => {
      if (!window.confirm(`Drive every reservation waiting on ${p.name} now?`)) return;
      try {
        const out = await api("POST", "/v1/admin/retry", { participant: p.name });
        flash(`Retried ${out.driven} reservation(s) waiting on ${p.name}.`);
      } catch (err) { flash("Retry refused: " + describe(err), true); }
    });
    return el("tr", { "data-participant": p.name }, el("td", { text: p.name }),
      el("td", { class: "mono url", text: p.url }),
      el("td", {}, el("span", { class: "badge " + (p.serving ? "ok" : "bad"), text: p.serving ? "reachable" : "unreachable" })),
      el("td", { class: "num", text: p.latency_ms.toFixed(1) + " ms" }),
      el("td", { class: "num backlog", text: backlog(p.name) }),
      el("td", { class: "err" }, p.last_error ? [p.last_error, el("div", { class: "muted", text: when(p.last_error_at) })] : ""),
      el("td", {}, retry));
  });
  main.replaceChildren(el("h1", { text: "Participants" }),
    el("p", { class: "muted", text: "Health checked now; latency is the health check's; the backlog is the stuck reservations waiting on it; the last error is the last failed call's, kept after it answers again." }),
    el("div", { class: "table-wrap" }, el("table", { id: "participants" },
      el("thead", {}, el("tr", {}, ["name", "url", "health", "latency", "backlog", "last error", ""].map((h) => el("th", { text: h })))),
      el("tbody", {}, rows.length ? rows : emptyRow(7, "No participants registered.")))));
}

async function sinks() {
  main.replaceChildren(el("h1", { text: "Event sinks" }), el("p", { class: "muted", text: "Loading…" }));
  const list = (await api("GET", "/v1/admin/sinks")).sinks;
  const rows = list.map((s) => {
    const webhook = s.name.startsWith("webhook:") ? s.name.slice("webhook:".length) : null;
    const status = s.paused ? ["bad", "paused"] : s.failing_since ? ["s-PENDING", "failing"] : ["ok", "delivering"];
    const action = el("td", {});
    if (s.paused && webhook) {
      const resume = el("button", { type: "button", text: "Resume" });
      resume.addEventListener("click", async () => {
        if (!window.confirm(`Resume webhook ${webhook}? Delivery restarts at the first event it has not taken.`)) return;
        try {
          await api("POST", `/v1/admin/webhooks/${encodeURIComponent(webhook)}:resume`, {});
          flash(`Webhook ${webhook} resumed.`);
          await sinks();
        } catch (err) { flash("Resume refused: " + describe(err), true); }
      });
      action.append(resume);
    }
    return el("tr", { "data-sink": s.name }, el("td", { class: "mono", text: s.name }),
      el("td", { text: String(s.delivered_through) }), el("td", { text: s.lag_seconds.toFixed(1) + " s" }),
      el("td", {}, el("span", { class: "badge " + status[0], text: status[1] })),
      el("td", { class: "err", text: s.last_error || "" }), action);
  });
  main.replaceChildren(el("h1", { text: "Event sinks" }),
    el("p", { class: "muted", text: "NATS and webhooks: delivered through which sequence, how far behind, paused or not." }),
    el("div", { class: "table-wrap" }, el("table", { id: "sinks" },
      el("thead", {}, el("tr", {}, ["sink", "delivered through", "lag", "state", "last error", ""].map((h) => el("th", { text: h })))),
      el("tbody", {}, rows.length ? rows : emptyRow(6, "No event sinks configured (NATS, webhooks).")))));
}

async function audit() {
  main.replaceChildren(el("h1", { text: "Audit" }), el("p", { class: "muted", text: "Loading…" }));
  const page = await api("GET", "/v1/admin/audit?page_size=100");
  main.replaceChildren(el("h1", { text: "Audit" }), el("div", { class: "table-wrap" }, el("table", {},
    el("thead", {}, el("tr", {}, ["when", "who", "action", "reservation", "reason"].map((h) => el("th", { text: h })))),
    el("tbody", {}, page.entries.length ? page.entries.map((a) => el("tr", {}, el("td", { text: when(a.at) }), el("td", { text: a.principal || "(anonymous)" }),
      el("td", { text: a.action }),
      el("td", {}, a.reservation_id ? idLink(a.reservation_id) : "-"),
      el("td", { text: a.reason })))
      : emptyRow(5, "No operator actions yet.")))));
}

// The feed of every change (SPEC 10): the last EVENTS_BEFORE events before the page opened,
// then live, newest on top, at most EVENTS_SHOWN rows.
const EVENTS_BEFORE = 50;
const EVENTS_SHOWN = 200;

async function liveEvents() {
  main.replaceChildren(el("h1", { text: "Live events" }), el("p", { class: "muted", text: "Loading…" }));
  const start = (await api("GET", "/v1/events:latest?back=" + EVENTS_BEFORE)).sequence;
  const status = el("span", { id: "events-live", text: "connecting…" });
  const body = el("tbody", { id: "events" }, emptyRow(6, "No events yet: each change appears here as it happens."));
  main.replaceChildren(el("h1", { text: "Live events" }),
    el("p", { class: "muted" }, "Every change of a reservation as it happens, newest first: ", status),
    el("div", { class: "table-wrap" }, el("table", {},
      el("thead", {}, el("tr", {}, ["sequence", "when", "type", "reservation", "holder", "state"].map((h) => el("th", { text: h })))),
      body)));
  cleanup.push(followEvents(start, (e) => {
    const r = e.reservation || {};
    for (const none of body.querySelectorAll("tr.empty")) none.remove();
    body.prepend(el("tr", { class: "event", "data-sequence": String(e.sequence), "data-type": e.type, "data-reservation": r.id || "" },
      el("td", { class: "mono", text: String(e.sequence) }),
      el("td", { text: when(e.occurred_at) }),
      el("td", { class: "mono", text: e.type }),
      el("td", {}, r.id ? idLink(r.id) : "-"),
      el("td", { text: r.holder || "" }),
      el("td", {}, badge(r.state))));
    while (body.children.length > EVENTS_SHOWN) body.lastChild.remove();
  }, (text) => { status.textContent = text; }));
}

// ---------- routing ----------

async function route() {
  for (const stop of cleanup.splice(0)) stop();
  const hash = location.hash.replace(/^#/, "") || "/";
  const [path, query] = hash.split("?");
  const params = new URLSearchParams(query || "");
  // A reservation's page: #/r/ID or #/reservations/ID.
  const one = path.match(/^\/(?:r|reservations)\/(.+)$/);
  const view = path === "/" ? "overview" : one || path === "/search" ? "reservations" : path === "/queue" ? "inventory" : path.slice(1);
  for (const a of document.querySelectorAll("#nav a")) a.classList.toggle("active", a.dataset.view === view);
  document.getElementById("forget-key").classList.toggle("hidden", !sessionStorage.getItem(KEY));
  try {
    if (path === "/") await overview();
    else if (path === "/reservations") await reservations(params);
    else if (one) await reservation(decodeURIComponent(one[1]));
    else if (path === "/search") await search(params.get("q") || "");
    else if (path === "/stuck") await stuck();
    else if (path === "/inventory") await inventory(params);
    else if (path === "/queue") await queuePage(params);
    else if (path === "/participants") await participants();
    else if (path === "/audit") await audit();
    else if (path === "/sinks") await sinks();
    else if (path === "/events") await liveEvents();
    else main.replaceChildren(el("h1", { text: "Not found" }), el("p", { text: "No such page: " + path }));
  } catch (err) {
    if (!(err instanceof ApiError && err.status === 401)) {
      main.replaceChildren(el("h1", { text: "Error" }), el("p", { class: "error", text: describe(err) }));
    }
  }
}

window.addEventListener("hashchange", () => { clearFlash(); route(); });
// After every script of the page ran (oncall.js holds views route() calls).
document.addEventListener("DOMContentLoaded", route);
