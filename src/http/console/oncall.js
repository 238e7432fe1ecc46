// holdfast console, the on-call views: the overview (counts by state from the database, the
// last hour per minute), the search box, the inventory (stock levels at the participants, and
// each resource's queue length from waitlist.js) and
// stuck work, oldest first. Built on console.js's helpers (el, fill, api, ...); no framework,
// everything shown through textContent or SVG attributes (no inline style under the CSP).
"use strict";

// The overview: counts by state from the database (Admin CountReservations), never counters
// since a process started; the last hour per minute as small bar charts.
const LIVE_STATES = ["TRYING", "HELD", "CONFIRMING", "CANCELLING", "EXPIRED"];

async function overview() {
  const live = el("div", { class: "grid", id: "counts" });
  const hour = el("div", { class: "grid", id: "hour" });
  const charts = el("div", { class: "charts", id: "charts" });
  const note = el("p", { class: "muted", id: "counted-at" });
  main.replaceChildren(
    el("h1", { text: "Overview" }),
    el("h2", { text: "Live now" }),
    el("p", { class: "muted", text: "Every reservation not finished, counted in the database. EXPIRED here: a hold past its time whose release has not run yet." }),
    live,
    el("h2", { class: "spaced", text: "Created in the last hour, by state now" }), hour,
    el("h2", { class: "spaced", text: "Per minute, last hour" }), charts, note);
  async function refresh() {
    let c;
    try {
      c = await api("GET", "/v1/admin/counts");
    } catch (err) {
      if (err instanceof ApiError && err.status === 401) throw err;
      note.textContent = "Counts unavailable: " + describe(err);
      return;
    }
    live.replaceChildren(...LIVE_STATES.map((s) => stat(s, c.live[s] || 0, "s-" + s, s)));
    const totals = {};
    for (const m of c.last_hour) for (const [s, n] of Object.entries(m.counts)) totals[s] = (totals[s] || 0) + n;
    hour.replaceChildren(...STATES.map((s) => stat(s, totals[s] || 0, "s-" + s)));
    const at = new Date(c.at).getTime();
    const perMinute = (pick) => {
      const bars = new Array(60).fill(0);
      for (const m of c.last_hour) {
        const i = 59 - Math.floor((at - new Date(m.start).getTime()) / 60000);
        if (i >= 0 && i < 60) bars[i] += pick(m.counts);
      }
      return bars;
    };
    const sum = (counts, states) => states.reduce((t, s) => t + (counts[s] || 0), 0);
    charts.replaceChildren(
      chart("reserved", perMinute((k) => sum(k, STATES))),
      chart("now confirmed", perMinute((k) => sum(k, ["CONFIRMED", "CONFIRMING"]))),
      chart("now expired", perMinute((k) => sum(k, ["EXPIRED"]))),
      chart("rejected or failed", perMinute((k) => sum(k, ["REJECTED", "FAILED"]))));
    note.textContent = c.last_hour.length
      ? "Counted in the database at " + new Date(c.at).toLocaleTimeString() + "; refreshed every 5 s."
      : "No reservation was created in the last hour. Counted at " + new Date(c.at).toLocaleTimeString() + ".";
  }
  await refresh();
  const timer = setInterval(() => refresh().catch(() => {}), 5000);
  cleanup.push(() => clearInterval(timer));
}

// A small bar chart of 60 per-minute values (oldest left), with its total and peak.
function chart(label, bars) {
  const NS = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(NS, "svg");
  svg.setAttribute("viewBox", "0 0 120 32");
  svg.setAttribute("preserveAspectRatio", "none");
  svg.setAttribute("role", "img");
  const peak = Math.max(1, ...bars);
  bars.forEach((v, i) => {
    if (!v) return;
    const h = Math.max(1, (v / peak) * 30);
    const r = document.createElementNS(NS, "rect");
    r.setAttribute("x", String(i * 2));
    r.setAttribute("y", String(32 - h));
    r.setAttribute("width", "1.6");
    r.setAttribute("height", String(h));
    svg.append(r);
  });
  const total = bars.reduce((a, b) => a + b, 0);
  svg.setAttribute("aria-label", `${label}: ${total} in the last hour`);
  return el("div", { class: "chart", "data-chart": label },
    el("div", { class: "label", text: label }), svg,
    el("div", { class: "muted", text: total ? `${total} in the hour, at most ${Math.max(...bars)} a minute` : "none in the hour" }));
}

// ---------- search: one box for an id, its first characters, a request id, a holder, a label ----------

const HEXISH = /^[0-9a-fA-F-]+$/;

document.getElementById("search").addEventListener("submit", (e) => {
  e.preventDefault();
  const q = document.getElementById("search-input").value.trim();
  location.hash = "#/search?q=" + encodeURIComponent(q);
});

// What a query may be, as JSON API lookups: [what matched, query string].
function lookupsFor(q) {
  const out = [];
  const digits = q.replace(/-/g, "").length;
  if (HEXISH.test(q) && digits >= 4 && digits <= 32) out.push(["id", "id_prefix=" + encodeURIComponent(q)]);
  if (q.includes("=")) out.push(["label", "label=" + encodeURIComponent(q)]);
  else out.push(["request id", "request_id=" + encodeURIComponent(q)], ["holder", "holder=" + encodeURIComponent(q)]);
  return out;
}

async function search(q) {
  document.getElementById("search-input").value = q;
  const title = el("h1", { text: "Search" });
  if (!q) {
    main.replaceChildren(title, el("p", { class: "muted", id: "search-help",
      text: "Type a reservation id or its first characters (at least 4 hex digits), a request id, a holder, or a label as key=value." }));
    return;
  }
  main.replaceChildren(title, el("p", { class: "muted", text: "Searching…" }));
  const results = await Promise.all(lookupsFor(q).map(async ([by, query]) => {
    try {
      return [by, (await api("GET", `/v1/reservations?${query}&page_size=25`)).reservations, null];
    } catch (err) {
      if (err instanceof ApiError && err.status === 401) throw err;
      return [by, [], describe(err)];
    }
  }));
  const found = new Map();
  for (const [, list] of results) for (const r of list) if (!found.has(r.id)) found.set(r.id, r);
  // One match: its page (replacing this entry, so Back does not bounce here again).
  if (found.size === 1) {
    location.replace("#/r/" + found.keys().next().value);
    return;
  }
  main.replaceChildren(title,
    el("p", { class: "muted", id: "search-summary" }, `“${q}”: `,
      results.map(([by, list, error]) => error ? `${by}: ${error}. ` : `${list.length}${list.length === 25 ? "+" : ""} by ${by}. `)),
    reservationTable([...found.values()], "search-results", "Nothing matches: no id starts with it, no request id, holder or label is it."));
}

// ---------- inventory: each resource's stock levels at its participant, live ----------

// The resources to watch: those in the address (#/inventory?r=seats/A1&r=...), else those of
// the latest reservations' branches.
async function inventoryItems(params) {
  const named = params.getAll("r").filter((r) => r.includes("/"));
  if (named.length) return [named, false];
  const page = await api("GET", "/v1/reservations?page_size=100");
  const seen = new Set();
  for (const r of page.reservations) for (const b of r.branches) seen.add(`${b.participant}/${b.resource}`);
  return [[...seen].sort().slice(0, 50), true];
}

// A bar of confirmed, held and available units (SVG: no inline style under the CSP).
function stockBar(l) {
  const NS = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(NS, "svg");
  svg.setAttribute("viewBox", "0 0 100 8");
  svg.setAttribute("preserveAspectRatio", "none");
  svg.setAttribute("class", "stock");
  const total = Math.max(1, l.capacity);
  let x = 0;
  for (const [part, n] of [["confirmed", l.confirmed], ["held", l.held], ["available", l.available]]) {
    const w = (Math.max(0, n) / total) * 100;
    const r = document.createElementNS(NS, "rect");
    r.setAttribute("x", String(x)); r.setAttribute("width", String(w));
    r.setAttribute("y", "0"); r.setAttribute("height", "8"); r.setAttribute("class", part);
    svg.append(r);
    x += w;
  }
  return svg;
}

async function inventory(params) {
  main.replaceChildren(el("h1", { text: "Inventory" }), el("p", { class: "muted", text: "Loading…" }));
  const [items, derived] = await inventoryItems(params);
  const input = el("input", { name: "r", placeholder: "participant/resource", required: true, pattern: "[^/]+/.+" });
  const form = el("form", { class: "filters", id: "inventory-add" },
    el("label", {}, "Watch a resource", input), el("button", { type: "submit", text: "Add" }));
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const q = new URLSearchParams();
    for (const r of [...(derived ? [] : items), input.value.trim()]) q.append("r", r);
    location.hash = "#/inventory?" + q.toString();
  });
  const body = el("tbody", {});
  const note = el("p", { class: "muted", id: "inventory-note" });
  main.replaceChildren(el("h1", { text: "Inventory" }),
    el("p", { class: "muted", text: derived
      ? "The resources of the latest reservations, as each participant counts them now (capacity = available + held + confirmed). Add others below."
      : "The resources named in the address, as each participant counts them now." }),
    form,
    el("div", { class: "table-wrap" }, el("table", { id: "inventory" },
      el("thead", {}, el("tr", {}, ["participant", "resource", "capacity", "available", "held", "confirmed", "queued", "", "error"].map((h) => el("th", { text: h })))),
      body)), note);
  async function refresh() {
    if (!items.length) {
      fill(body, emptyRow(9, "No resource to show: no reservation yet. Name one above (participant/resource)."));
      return;
    }
    const q = new URLSearchParams();
    for (const r of items) q.append("resource", r);
    const [lines, queued] = await Promise.all([
      api("GET", "/v1/admin/inventory?" + q.toString()).then((a) => a.lines), queueLengths(items)]);
    fill(body, lines.map((l) => el("tr", { "data-resource": `${l.participant}/${l.resource}` },
      el("td", { text: l.participant }), el("td", { class: "mono", text: l.resource }),
      l.error ? [el("td", { colspan: "4", class: "muted", text: "-" })]
        : [el("td", { class: "num", text: String(l.capacity) }), el("td", { class: "num available", text: String(l.available) }),
          el("td", { class: "num held", text: String(l.held) }), el("td", { class: "num confirmed", text: String(l.confirmed) })],
      queuedCell(`${l.participant}/${l.resource}`, queued.get(`${l.participant}/${l.resource}`)),
      l.error ? [el("td", {}), el("td", { class: "err", text: l.error })] : [el("td", {}, stockBar(l)), el("td", {})])));
    note.textContent = "Read from the participants at " + new Date().toLocaleTimeString() + "; refreshed every 2 s.";
  }
  await refresh();
  const timer = setInterval(() => refresh().catch((err) => { note.textContent = "Not refreshed: " + describe(err); }), 2000);
  cleanup.push(() => clearInterval(timer));
}

async function stuck() {
  main.replaceChildren(el("h1", { text: "Stuck work" }), el("p", { class: "muted", text: "Loading…" }));
  const page = await api("GET", "/v1/admin/stuck?page_size=100");
  // Oldest first: the longest stuck is the first to look at.
  const list = page.reservations.slice().sort((a, b) => new Date(a.created_at) - new Date(b.created_at));
  const lastError = (r) => (r.branches.find((b) => b.last_error) || {}).last_error || "";
  const work = new Map((page.work || []).map((w) => [w.reservation_id, w]));
  const attempts = (r) => (work.get(r.id) || {}).attempts || 0;
  const next = (r) => {
    const at = (work.get(r.id) || {}).next_attempt_at;
    if (!at) return "-";
    const ms = new Date(at).getTime() - Date.now();
    return ms > 0 ? "in " + age(new Date(Date.now() - ms).toISOString()) : "due now";
  };
  const rows = list.map((r) => el("tr", { "data-id": r.id },
    el("td", {}, idLink(r.id)), el("td", {}, badge(r.state)),
    el("td", { class: "num", text: age(r.created_at) }),
    el("td", { class: "num", text: String(attempts(r)) }),
    el("td", { class: "num next", text: next(r) }),
    el("td", { class: "err", text: lastError(r) || (r.refund && r.refund.failure_reason) || "" })));
  main.replaceChildren(el("h1", { text: "Stuck work" }),
    el("p", { class: "muted", text: "Not terminal past their due time, or with a branch error; oldest first. Retry drives one now (its page), or every reservation waiting on a participant (Participants)." }),
    el("div", { class: "table-wrap" }, el("table", { id: "stuck" },
      el("thead", {}, el("tr", {}, ["id", "state", "age", "attempts", "next retry", "last error"].map((h) => el("th", { text: h })))),
      el("tbody", {}, rows.length ? rows : emptyRow(6, "Nothing is stuck.")))),
    page.next_page_token ? el("p", { class: "muted", text: "More than 100: the oldest are not all shown (holdfast admin stuck pages through them)." }) : null);
}

// How long ago `iso` was, shortly: 42 s, 7 min, 3 h 5 min, 2 d 4 h.
function age(iso) {
  const s = Math.max(0, Math.floor((Date.now() - new Date(iso).getTime()) / 1000));
  if (s < 60) return s + " s";
  if (s < 3600) return Math.floor(s / 60) + " min";
  if (s < 86400) return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
  return `${Math.floor(s / 86400)} d ${Math.floor((s % 86400) / 3600)} h`;
}
