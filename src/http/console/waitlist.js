// holdfast console, waitlists (SPEC 11): a resource's queue in offer order (#/queue?participant=P&resource=R),
// the inventory's "queued" column (each queue's length), and where a QUEUED reservation waits on
// its page. Built on console.js's helpers (el, fill, api, ...); everything through textContent.
"use strict";

// The most entries the queue page reads (pages of 100); the length is always the whole queue's.
const QUEUE_SHOWN = 500;

function queueHref(participant, resource) {
  const q = new URLSearchParams({ participant, resource });
  return "#/queue?" + q.toString();
}

// `participant/resource` (the resource may hold further slashes) -> [participant, resource].
function splitResource(item) {
  const cut = item.indexOf("/");
  return [item.slice(0, cut), item.slice(cut + 1)];
}

// Each resource's queue length, by "participant/resource"; null where it could not be read.
async function queueLengths(items) {
  const lengths = await Promise.all(items.map(async (item) => {
    const [participant, resource] = splitResource(item);
    const q = new URLSearchParams({ participant, resource, page_size: "1" });
    try {
      return (await api("GET", "/v1/admin/queue?" + q.toString())).length;
    } catch (err) {
      if (err instanceof ApiError && err.status === 401) throw err;
      return null;
    }
  }));
  return new Map(items.map((item, i) => [item, lengths[i]]));
}

// The inventory's "queued" cell: the queue's length, linking to its page.
function queuedCell(item, length) {
  const [participant, resource] = splitResource(item);
  return el("td", { class: "num queued" }, length === null || length === undefined ? "-"
    : el("a", { href: queueHref(participant, resource), text: String(length) }));
}

// Reads the queue from its head, page after page, up to QUEUE_SHOWN entries.
async function readQueue(participant, resource) {
  const entries = [];
  let token = "", length = 0, more = false;
  for (;;) {
    const q = new URLSearchParams({ participant, resource, page_size: "100" });
    if (token) q.set("page_token", token);
    const page = await api("GET", "/v1/admin/queue?" + q.toString());
    entries.push(...page.entries);
    length = page.length;
    token = page.next_page_token;
    if (!token) break;
    if (entries.length >= QUEUE_SHOWN) { more = true; break; }
  }
  return { entries, length, more };
}

async function queuePage(params) {
  const participant = params.get("participant") || "", resource = params.get("resource") || "";
  const title = el("h1", {}, "Queue of ", el("span", { class: "mono", text: `${participant}/${resource}` }));
  if (!participant || !resource) {
    main.replaceChildren(title, el("p", { class: "error", text: "Name the resource: #/queue?participant=P&resource=R" }));
    return;
  }
  const body = el("tbody", {});
  const length = el("span", { id: "queue-length", text: "…" });
  const note = el("p", { class: "muted", id: "queue-note" });
  main.replaceChildren(el("p", {}, el("a", { href: "#/inventory?r=" + encodeURIComponent(`${participant}/${resource}`), text: "← Inventory" })),
    title,
    el("p", { class: "muted" }, "Waiting for released units, in offer order (position 1 is offered first): ", length, " in all."),
    el("div", { class: "table-wrap" }, el("table", { id: "queue" },
      el("thead", {}, el("tr", {}, ["position", "reservation", "holder", "quantity", "since", "until"].map((h) => el("th", { text: h })))),
      body)), note);
  async function refresh() {
    const q = await readQueue(participant, resource);
    length.textContent = String(q.length);
    fill(body, q.entries.length ? q.entries.map((e) => el("tr", { "data-id": e.reservation_id, "data-position": String(e.position) },
      el("td", { class: "num", text: String(e.position) }), el("td", {}, idLink(e.reservation_id)),
      el("td", { text: e.holder }), el("td", { class: "num", text: String(e.quantity) }),
      el("td", { text: when(e.since) }), el("td", { text: when(e.until) })))
      : emptyRow(6, "nobody is waiting"));
    note.textContent = (q.more ? `The first ${q.entries.length} shown (holdfast admin queue lists them all). ` : "")
      + "Read at " + new Date().toLocaleTimeString() + "; refreshed every 2 s.";
  }
  await refresh();
  const timer = setInterval(() => refresh().catch((err) => { note.textContent = "Not refreshed: " + describe(err); }), 2000);
  cleanup.push(() => clearInterval(timer));
}

// A QUEUED reservation's page: where it waits and until when.
function queueDetails(r) {
  if (!r.queue) return null;
  const q = r.queue;
  return [el("dt", { text: "Queued" }), el("dd", { id: "queue-place" }, `position ${q.position} in `,
    el("a", { href: queueHref(q.participant, q.resource), class: "mono", text: `${q.participant}/${q.resource}` }),
    q.during ? ` (${when(q.during.start)} - ${when(q.during.end)})` : ""),
  el("dt", { text: "Waits until" }), el("dd", { id: "queue-until", text: when(q.until) })];
}

// Watch carries no queue place: while the reservation is QUEUED its page reads it again (on
// each update and every 2 s, as its position moves up), else it shows the update as it came.
function followQueue(id, parts) {
  const again = async () => renderReservation(await api("GET", "/v1/reservations/" + encodeURIComponent(id)), parts);
  const timer = setInterval(() => {
    if (parts.state.dataset.state === "QUEUED") again().catch(() => {});
  }, 2000);
  cleanup.push(() => clearInterval(timer));
  return (fresh) => (fresh.state === "QUEUED" && !fresh.queue ? again().catch(() => {}) : renderReservation(fresh, parts));
}
