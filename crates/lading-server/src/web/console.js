// The console's script, served inline in index.html (see `index` in lib.rs).
"use strict";
const ENDED_JOB_STATES = ["Completed", "Deleted"];
const JOB_STATES = ["Pending","Held","Estimating","Provisioning","Downloading","Processing",
  "Storing","Recording","Notify","Failed","Completed","Deleted"];
const BATCH_STATES = ["Pending","Held","Processing","Reporting","UpdateReporting","Failed","Completed","Deleted"];
const QUEUES = ["ingest","accessSmall","accessLarge"];
// The actions each state allows (what the server would accept), so no row offers more.
const JOB_ACTIONS = { Pending: ["hold"], Held: ["release", "delete"], Failed: ["requeue", "delete"],
  Completed: ["delete"], Deleted: ["delete"] };
const BATCH_ACTIONS = { Pending: ["hold"], Held: ["release", "delete"], Failed: ["update-reporting", "delete"] };
const DESTRUCTIVE = new Set(["delete", "approve deletion"]);

let token = "";
const hash = new URLSearchParams(location.hash.slice(1));
if (hash.get("token")) {
  localStorage.setItem("lading-token", hash.get("token"));
  history.replaceState(null, "", location.pathname + "#/overview");
}
token = localStorage.getItem("lading-token") || "";

const $ = (id) => document.getElementById(id);
const el = (tag, attrs = {}, ...kids) => {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  for (const k of kids) e.append(k);
  return e;
};
const link = (href, text, attrs = {}) => el("a", Object.assign({ href }, attrs), text);
const when = (ms) => ms ? new Date(ms).toISOString().replace(".000Z", "Z") : "";
const ago = (ms) => {
  if (!ms) return "";
  const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
  return s < 120 ? s + " s ago" : s < 7200 ? Math.round(s / 60) + " min ago" : Math.round(s / 3600) + " h ago";
};
// How long since `ms`, as "12 min".
const age = (ms) => {
  const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
  return s < 120 ? s + " s" : s < 7200 ? Math.round(s / 60) + " min" : s < 172800 ? Math.round(s / 3600) + " h" : Math.round(s / 86400) + " d";
};
// Rebuilds `box` only when what it shows changed (`key`): a re-render for an unrelated event
// leaves its buttons (and a confirmation being asked) where they are, under the pointer.
function keyed(box, key, build) {
  if (box.dataset.key === key) return;
  box.dataset.key = key;
  box.replaceChildren(...build());
}
const SVG = "http://www.w3.org/2000/svg";
const svgEl = (tag, attrs = {}, text) => {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
};
// A bar per minute; hovering a bar tells its minute and count.
function drawChart(svg, minutes, field, from = "60 min ago") {
  const W = 620, H = 100, top = 12, bottom = 14, left = 34;
  const max = Math.max(1, ...minutes.map((m) => m[field] || 0));
  const bw = (W - left) / Math.max(1, minutes.length);
  const kids = [svgEl("text", { x: 2, y: top }, String(max)), svgEl("text", { x: 2, y: H - bottom }, "0"),
    svgEl("text", { x: left, y: H - 2 }, from), svgEl("text", { x: W - 22, y: H - 2 }, "now")];
  minutes.forEach((m, i) => {
    const h = Math.round((H - top - bottom) * (m[field] || 0) / max);
    const r = svgEl("rect", { class: field, x: (left + i * bw + 0.5).toFixed(1), y: H - bottom - h,
      width: Math.max(1, bw - 1).toFixed(1), height: h, "data-count": m[field] || 0 });
    r.append(svgEl("title", {}, new Date(m.start_ms).toISOString().slice(11, 16) + " UTC: " + (m[field] ?? "–")));
    kids.push(r);
  });
  svg.replaceChildren(...kids);
  const total = minutes.reduce((a, m) => a + (m[field] || 0), 0);
  svg.dataset.total = String(total);
  svg.setAttribute("aria-label", total + " jobs " + field + " in the last hour, at most " + max + " in a minute");
}
// Merritt's time form, "yyyy-MM-dd HH:mm:ss +0000", as epoch ms.
const parseTs = (t) => t ? Date.parse(t.replace(" ", "T").replace(" +0000", "Z")) : 0;

class Unauthorized extends Error {}

async function api(method, path, body) {
  const headers = { Authorization: "Bearer " + token };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const r = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  const data = r.status === 204 ? null : await r.json().catch(() => null);
  if (r.status === 401) throw new Unauthorized((data && data.error) || "unauthorized");
  if (!r.ok) throw new Error((data && data.error) || (method + " " + path + ": " + r.status));
  return data;
}

// Errors stay until dismissed; notices acknowledge an action and fade after a while.
function showError(e) {
  if (e instanceof Unauthorized) { signOut("That token was refused: " + e.message); return; }
  $("error-text").textContent = String(e.message || e);
  $("error").hidden = false;
}
$("dismiss-error").addEventListener("click", () => { $("error").hidden = true; });
let noticeTimer = null;
function notice(text) {
  $("notice").textContent = text;
  $("notice").hidden = false;
  clearTimeout(noticeTimer);
  noticeTimer = setTimeout(() => { $("notice").hidden = true; }, 8000);
}

async function act(method, path, body, done) {
  try {
    const r = await api(method, path, body);
    notice(done(r));
  } catch (e) { showError(e); }
  refresh();
}

function button(label, attrs, onclick) {
  const b = el("button", attrs, label);
  b.addEventListener("click", onclick);
  return b;
}

// A destructive action asks first: its button turns into "confirm …" and "cancel".
function actionButton(label, onconfirm) {
  const box = el("span");
  const plain = () => {
    box.replaceChildren(button(label, { "data-action": label, class: DESTRUCTIVE.has(label) ? "danger" : "" },
      () => DESTRUCTIVE.has(label) ? ask() : onconfirm()));
  };
  const ask = () => {
    box.replaceChildren(
      button("confirm " + label, { "data-confirm": label, class: "danger" }, onconfirm),
      button("cancel", { "data-cancel": label }, plain));
  };
  plain();
  return box;
}

function jobActions(id, state) {
  const box = el("span");
  for (const a of JOB_ACTIONS[state] || []) {
    box.append(actionButton(a, () => act("POST", "/api/v1/jobs/" + id + "/" + a, undefined,
      (r) => r.purged ? "Job " + id + " purged" : "Job " + id + ": " + a + " done; now " + r.status)));
  }
  return box;
}

// A status message is red only where the state is a failure ("its last job ended" is news).
function msgClass(state) {
  return state === "Failed" ? "msg fail" : "msg";
}

// A record's transitions (its status's history), oldest first.
function renderHistory(body, status) {
  body.replaceChildren();
  for (const h of status.history || []) {
    body.append(el("tr", { "data-history": h.to }, el("td", {}, h.at || ""), el("td", {}, h.from || "-"),
      el("td", {}, h.to || ""), el("td", {}, h.host || ""), el("td", { class: msgClass(h.to) }, h.message || "")));
  }
  if (!body.childNodes.length) body.append(el("tr", {}, el("td", { colspan: "5", class: "muted" }, "no transitions recorded")));
}

// ---- views ----------------------------------------------------------------------------

const VIEWS = ["login", "overview", "batches", "batch", "jobs", "job", "generic", "outbox", "processes", "stage", "audit", "submit"];
// What a submitter's console shows: its deposits, their jobs, and the submit form.
const DEPOSITOR_VIEWS = ["login", "batches", "batch", "job", "submit"];
// Who the token is (GET /api/v1/me): its name, role and usable profiles.
let me = null;
function route() {
  const [path, query] = location.hash.replace(/^#\/?/, "").split("?");
  const params = new URLSearchParams(query || "");
  const parts = path.split("/");
  let view = parts[0] || "overview";
  if (!token) view = "login";
  if (view === "logout") { signOut(""); return { view: "login", arg: "" }; }
  const arg = decodeURIComponent(parts.slice(1).join("/"));
  if (view === "stages") view = arg ? "stage" : "overview";
  if (!VIEWS.includes(view)) view = "overview";
  // A record's own address is under its list's (#/jobs/JID, #/batches/BID); the singular
  // forms (#/job/JID) still open it.
  if (view === "jobs" && /^jid\d+$/.test(arg)) view = "job";
  if (view === "batches" && /^bid\d+$/.test(arg)) view = "batch";
  if (me && me.role !== "admin" && !DEPOSITOR_VIEWS.includes(view)) view = "batches";
  return { view, arg, params };
}

function signOut(why) {
  token = "";
  me = null;
  delete document.body.dataset.role;
  $("whoami").textContent = "";
  localStorage.removeItem("lading-token");
  if (why) { $("error-text").textContent = why; $("error").hidden = false; }
  if (location.hash !== "#/login") location.hash = "#/login";
  show();
}

function show() {
  if (token && !me) return;
  const { view } = route();
  for (const v of VIEWS) $(v + "-view").hidden = v !== view;
  $("nav").hidden = view === "login";
  const section = { batch: "batches", job: "jobs", stage: "overview" }[view] || view;
  for (const a of document.querySelectorAll("[data-nav]")) a.classList.toggle("on", a.dataset.nav === section);
  if (view === "login") { $("token").focus(); return; }
  const { arg, params } = route();
  if (view === "jobs") {
    // The address holds the state and the filters (#/jobs/Failed?collection=…&message=…).
    const before = jobFilterParams().toString();
    if (JOB_STATES.includes(arg)) $("job-state").value = arg;
    $("job-q").value = params.get("q") || "";
    $("failure-kind").value = params.get("failure_kind") || "";
    for (const i of document.querySelectorAll("[data-filter]")) i.value = params.get(i.dataset.filter) || "";
    if (jobFilterParams().toString() !== before) jobPages.reset();
  }
  refresh();
}

async function renderOverview() {
  const [s, ov, dels, procs, stages] = await Promise.all([api("GET", "/api/v1/status"), api("GET", "/api/v1/overview"),
    api("GET", "/api/v1/deletions?open=true"), api("GET", "/api/v1/processes"), api("GET", "/api/v1/metrics/stages")]);
  renderStageTable(stages);
  const alive = procs.filter((p) => p.alive);
  $("processes-summary").replaceChildren(el("span", { "data-processes-alive": String(alive.length) },
    alive.length + " alive (" + alive.reduce((n, p) => n + p.running.length, 0) + " jobs and batches running), " +
    (procs.length - alive.length) + " gone — "), link("#/processes", "see the processes"));
  const depth = (headId, rowId, states, counts, hrefFor) => {
    keyed($(headId), states.join(), () => states.map((st) => el("th", {}, st)));
    keyed($(rowId), JSON.stringify(counts), () => states.map((st) =>
      el("td", { "data-depth": st }, hrefFor ? link(hrefFor(st), String(counts[st] ?? 0)) : String(counts[st] ?? 0))));
  };
  depth("depth-head", "depth", JOB_STATES, s.jobs, (st) => "#/jobs/" + st);
  depth("bdepth-head", "bdepth", BATCH_STATES, s.batches, null);
  $("oldest").replaceChildren(...JOB_STATES.map((st) => {
    const o = ov.oldest[st] || {};
    // A job that ended waits for nothing: its age there says nothing.
    if (ENDED_JOB_STATES.includes(st)) return el("td", { "data-oldest": st, title: "ended jobs wait for nothing" }, "");
    return el("td", { "data-oldest": st, title: o.since_ms ? "since " + when(o.since_ms) : "empty" },
      o.since_ms ? (o.exact ? "" : "≥ ") + age(o.since_ms) : "–");
  }));
  drawChart($("chart-completed"), ov.per_minute, "completed");
  drawChart($("chart-failed"), ov.per_minute, "failed");
  $("chart-note").textContent = ov.complete_from_ms > ov.per_minute[0].start_ms
    ? "Counted since " + when(ov.complete_from_ms) + " (the hour before is still being read back)." : "";
  keyed($("held"), JSON.stringify(ov.held_collections), () => ov.held_collections.length
    ? ov.held_collections.flatMap((name) => [el("span", { "data-held": name }, name + " "),
        button("release", { "data-release": name }, () => act("DELETE", "/api/v1/collections/" + encodeURIComponent(name) + "/hold", undefined,
          (r) => "Collection " + name + " released: " + (r.released || 0) + " batches and jobs back to Pending")), " "])
    : ["none held"]);
  keyed($("foreign-locks"), JSON.stringify(s.foreign_locks), () => s.foreign_locks.length
    ? s.foreign_locks.flatMap((l) => [el("span", { "data-lock": l.kind + "/" + l.name }, l.kind + " " + l.name + " since " + when(l.since_ms) + " "),
        button("clear", { "data-action": "clear-lock" },
          () => act("DELETE", "/api/v1/locks/" + l.kind + "/" + encodeURIComponent(l.name), undefined,
            () => l.kind + " lock " + l.name + " cleared")), " "])
    : ["none"]);
  keyed($("queues"), JSON.stringify(s.paused_queues), () => QUEUES.flatMap((name) => {
    const paused = s.paused_queues.includes(name);
    return [el("span", { "data-queue-state": name }, name + (paused ? " (paused) " : " (running) ")),
      button(paused ? "resume" : "pause", { "data-queue": name },
        () => act(paused ? "DELETE" : "PUT", "/api/v1/queues/" + name + "/pause", undefined,
          () => "Queue " + name + (paused ? " resumed" : " paused"))), " "];
  }));
  // Every outside service work depends on: down ones first, in red; work waits on them.
  const deps = [...(ov.dependencies || [])].sort((a, b) => (a.up - b.up) || a.label.localeCompare(b.label));
  keyed($("deps"), JSON.stringify(deps), () => deps.length
    ? deps.map((d) => el("tr", { "data-dep": d.kind + "/" + d.name, class: d.up ? "" : "down" },
        el("td", {}, d.label), el("td", {}, d.address || ""),
        el("td", { "data-dep-state": d.up ? "up" : "down" },
          d.up ? "up" : "down since " + when(d.down_since_ms) + (d.cause ? ": " + d.cause : "")),
        el("td", {}, String(d.waiting)), el("td", {}, String(d.probes || 0)),
        el("td", {}, (d.seen_by || []).join(", "))))
    : [el("tr", {}, el("td", { colspan: "6", class: "muted" }, "none known yet"))]);
  // Deletion requests (approved ones while a node keeps them waiting): another admin decides.
  keyed($("deletions"), JSON.stringify(dels), () => dels.length
    ? dels.map((d) => el("tr", { "data-deletion": d.id },
        el("td", {}, d.id), el("td", {}, d.ark + (d.version ? " v" + d.version : " (every version)")),
        el("td", {}, d.reason), el("td", {}, d.requested_by + ", " + d.requested_at),
        el("td", { "data-deletion-state": d.status }, d.status === "approved" ? "approved, waiting: " + (d.waiting || "") : "asked"),
        el("td", {}, ...(d.status === "requested" ? [
          actionButton("approve deletion", () => act("POST", "/api/v1/deletions/" + d.id + "/approve", undefined,
            (r) => "Deletion " + d.id + ": " + r.status + " (" + r.files.length + " files removed)")),
          actionButton("cancel deletion", () => act("POST", "/api/v1/deletions/" + d.id + "/cancel", undefined,
            () => "Deletion " + d.id + " cancelled"))] : []))))
    : [el("tr", {}, el("td", { colspan: "6", class: "muted" }, "none"))]);
  $("outbox-summary").replaceChildren(s.outbox.waiting + " waiting, " + s.outbox.dead + " given up — ", link("#/outbox", "see the outbox"));
  // The inventory's copies on every storage node, as the fixity checker last found them.
  const f = s.fixity;
  if (f) {
    $("fixity").replaceChildren(el("span", { "data-fixity": f.bad + f.missing ? "bad" : "good" },
      f.copies + " copies, " + f.bad + " bad, " + f.missing + " missing" +
      (f.oldest_check ? "; the longest unchecked since " + f.oldest_check : "")));
  } else {
    $("fixity").textContent = "no stored copies yet";
  }
  for (const id of ["queues", "held", "foreign-locks", "processes-summary", "outbox-summary", "fixity"]) $(id).classList.remove("muted");
}

// A record's view (section[data-record=NAME]) opens with its title (NAME-title), actions
// (NAME-actions) and fields (NAME-fields).
for (const sec of document.querySelectorAll("section[data-record]")) {
  const name = sec.dataset.record;
  sec.prepend(el("h2", { id: name + "-title" }), el("div", { class: "bar", id: name + "-actions" }),
    el("dl", { id: name + "-fields" }));
}

// A list (tbody#NAME) shown a page at a time: the cursor of each page seen, the page shown,
// the next page's cursor; its bar below the table has NAME-first, NAME-next and NAME-page.
function pager(name) {
  $(name).closest("table").after(el("div", { class: "bar" },
    el("button", { id: name + "-first" }, "first page"), el("button", { id: name + "-next" }, "next page"),
    el("span", { id: name + "-page", class: "muted" })));
  const p = {
    cursors: [null], at: 0, next: null,
    cursor: () => p.cursors[p.at],
    reset() { p.cursors = [null]; p.at = 0; },
    buttons() {
      $(name + "-page").textContent = "page " + (p.at + 1);
      $(name + "-next").disabled = !p.next;
      $(name + "-first").disabled = p.at === 0;
    },
  };
  $(name + "-next").addEventListener("click", () => { if (p.next) { p.cursors[++p.at] = p.next; refresh(); } });
  $(name + "-first").addEventListener("click", () => { p.reset(); refresh(); });
  return p;
}

const batchPages = pager("batches");
async function renderBatches() {
  const q = $("batch-q").value.trim(), st = $("batch-state").value;
  const cursor = batchPages.cursor();
  const params = new URLSearchParams({ limit: "50" });
  if (q) params.set("q", q);
  if (st) params.set("state", st);
  if (cursor) params.set("after", cursor);
  const list = await api("GET", "/api/v1/batches?" + params);
  batchPages.next = list.next_after;
  const body = $("batches");
  if (body.dataset.key === JSON.stringify(list)) return batchPages.buttons();
  body.dataset.key = JSON.stringify(list);
  body.replaceChildren();
  for (const b of list.batches) {
    const jobs = Object.entries(b.jobs).filter(([, n]) => n > 0)
      .map(([k, n]) => n + " " + k.replace("batch-", "")).join(", ");
    const sub = b.submission || {};
    body.append(el("tr", { "data-batch": b.id },
      el("td", {}, link("#/batches/" + b.id, b.id)), el("td", { class: "state" }, b.status.status),
      el("td", {}, sub.submitter || ""), el("td", {}, sub.profile_name || sub.profile || ""),
      el("td", {}, sub.erc_what || sub.title || ""),
      el("td", {}, jobs || "none"), el("td", { class: msgClass(b.status.status) }, b.status.message || "")));
  }
  if (!list.batches.length) body.append(el("tr", {}, el("td", { colspan: "7", class: "muted" }, "no batches")));
  batchPages.buttons();
}

async function renderBatch(id) {
  const b = await api("GET", "/api/v1/batches/" + encodeURIComponent(id));
  const st = b.status.status;
  $("batch-title").textContent = "Batch " + b.id + " — " + st;
  $("batch-title").dataset.state = st;
  const failed = (b.jobs["batch-failed"] || []).length;
  keyed($("batch-actions"), b.id + "|" + st + "|" + (failed > 0), () => {
    if (me.role !== "admin") return [];
    const kids = (BATCH_ACTIONS[st] || []).map((a) => actionButton(a, () => act("POST", "/api/v1/batches/" + b.id + "/" + a, undefined,
      (r) => "Batch " + b.id + ": " + a + " done; now " + r.status)));
    if (failed) {
      kids.push(actionButton("retry failed jobs", () => act("POST", "/api/v1/batches/" + b.id + "/requeue-failed", {},
        (r) => r.requeued.length + " failed jobs requeued" + (r.refused.length ? ", " + r.refused.length + " refused: " + r.refused.map((x) => x.id + " " + x.error).join("; ") : ""))));
    }
    return kids.length ? kids : [el("span", { class: "muted" }, "no action applies to a " + st + " batch")];
  });
  const f = $("batch-fields");
  f.replaceChildren();
  const sub = b.submission || {};
  const rows = [["state", st], ["message", b.status.message || ""], ["last change", b.status.last_modified || ""],
    ["submitter", sub.submitter || ""], ["profile", sub.profile_name || sub.profile || ""], ["title", sub.erc_what || sub.title || ""],
    ["uuid", sub.batchID || ""], ["payload", sub.payload_url || sub.filename || ""], ["locked", b.locked ? "yes" : "no"]];
  for (const [k, v] of rows) f.append(el("dt", {}, k), el("dd", { "data-field": k }, String(v)));
  keyed($("batch-jobs"), JSON.stringify(b.jobs), () => Object.entries(b.jobs).map(([folder, ids]) => {
    const cell = el("td");
    for (const j of ids) cell.append(link("#/jobs/" + j, j, { "data-job-link": j }), " ");
    if (!ids.length) cell.append(el("span", { class: "muted" }, "none"));
    return el("tr", { "data-folder": folder }, el("td", {}, folder.replace("batch-", "")), cell);
  }));
  renderHistory($("batch-history"), b.status);
  renderReport(b.status_report);
  await renderBatchJobs(b.id);
}

// The batch's jobs, a page at a time, with their objects' ARKs and local ids.
const batchJobPages = pager("batch-job-rows");
async function renderBatchJobs(bid) {
  const body = $("batch-job-rows");
  if (body.dataset.batch !== bid) { batchJobPages.reset(); body.dataset.batch = bid; }
  const params = new URLSearchParams({ limit: "100" });
  const cursor = batchJobPages.cursor();
  if (cursor) params.set("after", cursor);
  const page = await api("GET", "/api/v1/batches/" + encodeURIComponent(bid) + "/jobs?" + params);
  batchJobPages.next = page.next_after;
  keyed(body, JSON.stringify(page), () => page.jobs.length ? page.jobs.map((j) => el("tr", { "data-batch-job": j.id },
    el("td", {}, link("#/jobs/" + j.id, j.id)), el("td", { class: "state" }, j.state),
    el("td", { "data-ark": j.ark || "" }, j.ark || "—"), el("td", {}, (j.local_ids || []).join(", ")),
    el("td", { class: msgClass(j.state) }, j.message || "")))
    : [el("tr", {}, el("td", { colspan: "5", class: "muted" }, "no jobs"))]);
  batchJobPages.buttons();
}

// A batch's report as a table: its number, when, what completed and failed (linked), what a
// later report found fixed, an intake's error, and anything else it holds.
function renderReport(r) {
  const jobs = (ids) => {
    const cell = el("span");
    for (const j of ids || []) cell.append(link("#/jobs/" + j, j), " ");
    return cell;
  };
  keyed($("batch-report"), JSON.stringify(r || null), () => {
    if (!r) return [el("tr", {}, el("td", { class: "muted" }, "none yet"))];
    const row = (k, ...v) => el("tr", { "data-report": k }, el("th", {}, k), el("td", {}, ...v));
    const rows = [row("report", String(r.report_number ?? 1)), row("written", r.last_modified || ""),
      row("completed", String((r.completed_jobs || []).length) + " ", jobs(r.completed_jobs)),
      row("failed", el("span", { class: (r.failed_jobs || []).length ? "fail" : "" }, String((r.failed_jobs || []).length)), " ", jobs(r.failed_jobs))];
    if (r.updated_jobs) rows.push(row("fixed since the last report", String(r.updated_jobs.length) + " ", jobs(r.updated_jobs)));
    if (r.intake_error) rows.push(row("intake error", el("span", { class: "fail" }, r.intake_error)));
    const shown = ["report_number", "last_modified", "completed_jobs", "failed_jobs", "updated_jobs", "intake_error"];
    for (const [k, v] of Object.entries(r)) if (!shown.includes(k)) rows.push(row(k, typeof v === "string" ? v : JSON.stringify(v)));
    return rows;
  });
}

const jobPages = pager("jobs");
// The jobs page's filters as given (empty ones left out), its state first.
function jobFilterParams() {
  const state = $("job-state").value;
  const params = new URLSearchParams({ state });
  const kind = $("failure-kind").value, q = $("job-q").value.trim();
  if (state === "Failed" && kind) params.set("failure_kind", kind);
  if (q) params.set("q", q);
  for (const i of document.querySelectorAll("[data-filter]")) if (i.value.trim()) params.set(i.dataset.filter, i.value.trim());
  return params;
}
// Puts the page's filters in the address (the page then follows it).
function searchJobs() {
  const params = jobFilterParams();
  const state = params.get("state");
  params.delete("state");
  const want = "#/jobs/" + state + (params.toString() ? "?" + params : "");
  jobPages.reset();
  if (location.hash !== want) location.hash = want; else refresh();
}

// The count of what the filters select, and the bulk actions the state allows on it: each
// asks first, showing how many jobs it will touch, and acts on at most that many.
async function renderBulk(filter) {
  const c = await api("GET", "/api/v1/jobs/count?" + filter);
  const state = filter.get("state");
  const key = JSON.stringify([filter.toString(), c.matched]);
  if ($("bulk").dataset.key === key) return;
  $("jobs-count").textContent = c.matched + " " + state + " jobs match" + (c.complete ? "" : " (of the first " + c.scanned + " looked at)");
  $("jobs-count").dataset.matched = String(c.matched);
  keyed($("bulk"), key, () => c.matched ? (JOB_ACTIONS[state] || []).map((a) => {
    const box = el("span");
    const plain = () => box.replaceChildren(button(a + " all " + c.matched, { "data-bulk": a }, ask));
    const ask = () => box.replaceChildren(
      button("confirm " + a + " of " + c.matched + " jobs", { "data-bulk-confirm": a, class: "danger" }, async () => {
        const body = { action: a, filter: Object.fromEntries([...filter].map(([k, v]) => [k, k === "older_than_min" ? Number(v) : v])), max: c.matched };
        try {
          const op = await api("POST", "/api/v1/jobs/bulk", body);
          notice("Operation " + op.id + " started: " + a + " of up to " + c.matched + " jobs");
          location.hash = "#/audit";
        } catch (e) { showError(e); plain(); }
      }),
      button("cancel", { "data-bulk-cancel": a }, plain));
    plain();
    return box;
  }) : []);
}

async function renderJobs() {
  const filter = jobFilterParams();
  const state = filter.get("state");
  $("failure-kind").hidden = state !== "Failed";
  const params = new URLSearchParams(filter);
  params.set("limit", "50");
  const cursor = jobPages.cursor();
  if (cursor) params.set("after", cursor);
  const [list] = await Promise.all([api("GET", "/api/v1/jobs?" + params), renderBulk(filter)]);
  jobPages.next = list.next_after;
  const rows = await Promise.all(list.jobs.map((j) => api("GET", "/api/v1/jobs/" + j.id).catch(() => null)));
  const body = $("jobs");
  const key = JSON.stringify([list, rows.filter(Boolean).map((j) => j.status)]);
  if (body.dataset.key === key) return jobPages.buttons();
  body.dataset.key = key;
  body.replaceChildren();
  for (const j of rows.filter(Boolean)) {
    const s = j.status;
    body.append(el("tr", { "data-job": j.id },
      el("td", {}, link("#/jobs/" + j.id, j.id)), el("td", {}, link("#/batches/" + j.bid, j.bid)),
      el("td", { class: "state" }, s.status), el("td", {}, String(j.priority)),
      el("td", {}, String(s.retry_count ?? 0)),
      el("td", { class: "failure" }, s.failure_kind
        ? s.failed_stage + " (" + s.failure_kind + ", " + (s.failed_attempts || 1) + " attempts)" : ""),
      el("td", { title: s.last_modified || "" }, ago(parseTs(s.last_modified))),
      el("td", { class: msgClass(s.status) }, s.message || ""), el("td", {}, jobActions(j.id, s.status))));
  }
  if (!list.jobs.length) body.append(el("tr", {}, el("td", { colspan: "9", class: "muted" }, "no " + state + " jobs")));
  jobPages.buttons();
}

async function renderJob(id) {
  const [j, files] = await Promise.all([api("GET", "/api/v1/jobs/" + encodeURIComponent(id)),
    api("GET", "/api/v1/jobs/" + encodeURIComponent(id) + "/files")]);
  const s = j.status;
  $("job-title").textContent = "Job " + j.id + " — " + s.status;
  $("job-title").dataset.state = s.status;
  keyed($("job-actions"), j.id + "|" + s.status, () => {
    const kids = [me.role === "admin" ? jobActions(j.id, s.status) : el("span")];
    if (s.status === "Completed") kids.push(downloadButton(j));
    const last = files.stored[files.stored.length - 1];
    if (s.status === "Completed" && last) kids.push(accessButton(last.ark, last.version));
    if (!kids[0].childNodes.length && kids.length === 1) kids.push(el("span", { class: "muted" }, "no action applies to a " + s.status + " job"));
    return kids;
  });
  const f = $("job-fields");
  f.replaceChildren();
  const rows = [["state", s.status], ["batch", link("#/batches/" + j.bid, j.bid)], ["last successful", s.last_successful_status || ""],
    ["attempts", String(s.retry_count ?? 0)], ["failed at", s.failed_stage || ""], ["failure", s.failure_kind || ""],
    ["message", s.message || ""], ["last change", s.last_modified || ""], ["priority", String(j.priority)],
    ["space needed", String(j.space_needed) + " bytes"], ["locked", j.locked ? "yes (a worker holds it)" : "no"]];
  for (const [k, v] of rows) f.append(el("dt", {}, k), el("dd", { "data-field": k }, v));
  renderHistory($("job-history"), s);
  $("job-identifiers").textContent = JSON.stringify(j.identifiers, null, 2);
  $("job-metadata").textContent = JSON.stringify(j.metadata, null, 2);
  $("job-configuration").textContent = JSON.stringify(j.configuration, null, 2);
  renderFiles(files);
}

// What the job stored (from the inventory), its working files and its log on this host.
function renderFiles(files) {
  const stored = $("job-stored");
  stored.replaceChildren();
  for (const v of files.stored) {
    const body = el("tbody");
    for (const [path, size, sha] of v.files) {
      body.append(el("tr", { "data-stored-file": path }, el("td", {}, path), el("td", {}, String(size)), el("td", { class: "sha" }, sha)));
    }
    stored.append(el("h3", { "data-version": String(v.version) }, v.ark + " version " + v.version + " (" + v.created + ", " + v.files.length + " files)"),
      el("table", {}, el("thead", {}, el("tr", {}, el("th", {}, "file"), el("th", {}, "bytes"), el("th", {}, "SHA-256"))), body));
  }
  if (!files.stored.length) stored.append(el("p", { class: "muted" }, "nothing stored yet"));
  // Where each version's copies are, and what the last check of each found.
  if (files.copies && files.copies.length) {
    const body = el("tbody");
    for (const c of files.copies) {
      const state = c.bad || c.missing ? "bad" : "good";
      body.append(el("tr", { "data-copy": c.version + "@" + c.node, "data-copy-state": state },
        el("td", {}, String(c.version)), el("td", {}, c.node === 0 ? "0 (storage root)" : String(c.node)),
        el("td", {}, String(c.ok)), el("td", {}, String(c.bad)), el("td", {}, String(c.missing)),
        el("td", {}, c.last_checked || "never")));
    }
    stored.append(el("h3", {}, "Copies"), el("table", {}, el("thead", {}, el("tr", {},
      el("th", {}, "version"), el("th", {}, "node"), el("th", {}, "good"), el("th", {}, "bad"),
      el("th", {}, "missing"), el("th", {}, "last checked"))), body));
  }
  const w = files.working;
  $("job-working-title").textContent = "Working files on " + w.host + (w.truncated ? " (the first 1,000)" : "");
  const wb = $("job-working");
  wb.replaceChildren();
  for (const x of w.files) wb.append(el("tr", { "data-working-file": x.path }, el("td", {}, x.path), el("td", {}, String(x.size))));
  if (!w.files.length) wb.append(el("tr", {}, el("td", { colspan: "2", class: "muted" }, w.present ? "the working folder is empty" : "no working folder on this host")));
  $("job-log-title").textContent = "Log on " + w.host + (files.log.truncated ? " (its last lines)" : "");
  $("job-log").textContent = files.log.lines.length ? files.log.lines.join("\n") : "no log on this host";
}

// A version asked for through the access queue: a worker assembles its zip; the page
// follows the request and offers the zip once it is there.
function accessButton(ark, version) {
  const box = el("span", { id: "job-access" });
  const ask = button("ask for a zip through the access queue", { "data-action": "access" }, async () => {
    try {
      const r = await api("POST", "/api/v1/access", { ark, version });
      box.dataset.token = r.token;
      followAccess(box);
    } catch (e) { showError(e); }
  });
  box.append(ask);
  return box;
}
async function followAccess(box) {
  for (;;) {
    const v = await api("GET", "/api/v1/access/" + box.dataset.token).catch(() => null);
    if (!box.isConnected) return;
    if (v && v.state === "Completed") {
      box.replaceChildren(button("download the zip assembled", { "data-action": "access-file" }, async () => {
        const r = await fetch("/api/v1/access/" + box.dataset.token + "/file", { headers: { Authorization: "Bearer " + token } });
        if (!r.ok) return showError("access file: " + r.status);
        const a = el("a", { href: URL.createObjectURL(await r.blob()), download: ark.replace(/[^A-Za-z0-9]/g, "_") + "-v" + version + ".zip" });
        document.body.append(a); a.click(); a.remove();
      }));
      return;
    }
    box.replaceChildren(el("span", { "data-access-state": v ? v.state : "unknown" },
      "access request " + (v ? v.state : "unknown") + (v && v.message ? ": " + v.message : "") + " …"));
    if (v && v.state === "Failed") return;
    await new Promise((ok) => setTimeout(ok, 1000));
  }
}

function downloadButton(j) {
  return button("download the stored version", { "data-action": "download" }, async () => {
    try {
      const r = await fetch("/api/v1/jobs/" + j.id + "/download", { headers: { Authorization: "Bearer " + token } });
      if (!r.ok) throw new Error("download: " + r.status);
      const url = URL.createObjectURL(await r.blob());
      const a = el("a", { href: url, download: j.id + ".zip" });
      document.body.append(a); a.click(); a.remove();
      notice("Download of " + j.id + " started");
    } catch (e) { showError(e); }
  });
}

let openType = null;
async function renderGeneric() {
  const types = await api("GET", "/api/v1/types");
  const body = $("types");
  body.replaceChildren();
  for (const t of types) {
    body.append(el("tr", { "data-type": t.type },
      el("td", {}, button(t.type, { "data-open-type": t.type }, () => { openType = t.type; refresh(); })),
      el("td", {}, String(t.pending)), el("td", {}, String(t.running)), el("td", {}, String(t.finished)),
      el("td", { class: t.failed ? "msg" : "" }, String(t.failed)), el("td", {}, t.timeout_s + " s"),
      el("td", {}, String(t.max_attempts)), el("td", {}, t.rate_per_s ? String(t.rate_per_s) : "no limit")));
  }
  if (!types.length) body.append(el("tr", {}, el("td", { colspan: "8", class: "muted" }, "no generic job types")));
  const t = types.find((x) => x.type === openType);
  $("type-detail").hidden = !t;
  if (!t) return;
  $("type-title").textContent = "Type " + t.type;
  const enc = encodeURIComponent(t.type);
  const [running, failed] = await Promise.all([
    api("GET", "/api/v1/types/" + enc + "/jobs?state=running&limit=100"),
    api("GET", "/api/v1/types/" + enc + "/jobs?state=failed&limit=100")]);
  const rb = $("type-running");
  rb.replaceChildren();
  for (const j of running.jobs) {
    const stalled = Date.now() - j.updated_ms > t.timeout_s * 1000;
    rb.append(el("tr", { "data-generic-job": j.id }, el("td", {}, j.id), el("td", {}, j.owner || ""),
      el("td", {}, String(j.runs)), el("td", {}, ago(j.updated_ms)),
      el("td", { class: stalled ? "msg" : "muted" }, stalled ? "stalled: the monitor re-enqueues it" : "")));
  }
  if (!running.jobs.length) rb.append(el("tr", {}, el("td", { colspan: "5", class: "muted" }, "none running")));
  keyed($("type-failed"), JSON.stringify([t.type, failed.jobs.map((j) => [j.id, j.attempts, j.last_error])]), () => failed.jobs.length
    ? failed.jobs.map((j) => el("tr", { "data-generic-job": j.id }, el("td", {}, j.id), el("td", {}, String(j.attempts || 0)),
        el("td", { class: "msg fail" }, j.last_error || ""),
        el("td", {}, actionButton("retry", () => act("POST", "/api/v1/types/" + enc + "/jobs/" + encodeURIComponent(j.id) + "/retry",
          undefined, () => "Generic job " + j.id + " pending again")))))
    : [el("tr", {}, el("td", { colspan: "4", class: "muted" }, "none failed"))]);
}

async function renderAudit() {
  const ops = await api("GET", "/api/v1/audit");
  keyed($("audit"), JSON.stringify(ops), () => ops.length
    ? ops.map((o) => el("tr", { "data-op": o.id, "data-op-state": o.state },
        el("td", {}, o.id), el("td", { title: when(o.started_at_ms) }, ago(o.started_at_ms)), el("td", {}, o.who),
        el("td", {}, o.action), el("td", { class: "filter" }, Object.entries(o.filter).filter(([, v]) => v !== null && v !== "")
          .sort(([a], [b]) => (b === "state") - (a === "state")).map(([k, v]) => k + "=" + v).join(" ")),
        el("td", {}, String(o.matched) + " (at most " + o.max + ")"), el("td", { "data-op-done": String(o.done) }, String(o.done)),
        el("td", { class: o.refused_count ? "msg fail" : "", title: o.refused.map((r) => r.job + ": " + r.why).join("\n") }, String(o.refused_count)),
        el("td", { class: o.state === "interrupted" ? "msg fail" : "" }, o.state + (o.finished_at_ms ? " " + ago(o.finished_at_ms) : ""))))
    : [el("tr", {}, el("td", { colspan: "9", class: "muted" }, "no operation yet"))]);
}

async function renderOutbox() {
  const list = (await api("GET", "/api/v1/outbox")).entries;
  const dead = list.filter((o) => o.dead).length;
  $("outbox-count").textContent = list.length ? "(" + list.length + " waiting, " + dead + " given up)" : "(empty)";
  keyed($("outbox"), JSON.stringify(list), () => list.map((o) => {
    const state = o.dead ? "given up" : (o.delivering ? "delivering" : "waiting");
    return el("tr", { "data-outbox": o.name },
      el("td", {}, o.name), el("td", {}, o.kind), el("td", {}, o.key), el("td", { class: "state" }, state),
      el("td", {}, String(o.attempts)), el("td", { class: "msg fail" }, o.last_error || ""),
      el("td", {}, actionButton("retry", () => act("POST", "/api/v1/outbox/" + o.name + "/retry", undefined,
        () => "Outbox entry " + o.name + " due now"))));
  }));
}

const ms = (v) => v == null ? "–" : v < 1000 ? "≤ " + v + " ms" : "≤ " + v / 1000 + " s";
function renderStageTable(m) {
  keyed($("stages"), JSON.stringify(m.stages.map((s) => s.last_hour)), () => m.stages.length
    ? m.stages.map((s) => { const h = s.last_hour; return el("tr", { "data-stage": s.stage },
        el("td", {}, link("#/stages/" + encodeURIComponent(s.stage), s.stage)), el("td", { "data-stage-done": String(h.done) }, String(h.done)),
        el("td", { class: h.failed ? "msg fail" : "" }, String(h.failed)), el("td", {}, String(h.waited)),
        el("td", {}, ms(h.p50_ms)), el("td", {}, ms(h.p95_ms)), el("td", {}, h.depth == null ? "–" : String(h.depth))); })
    : [el("tr", {}, el("td", { colspan: "7", class: "muted" }, "no stage ran in the last day"))]);
}

async function renderStage(name) {
  const m = await api("GET", "/api/v1/metrics/stages");
  const s = m.stages.find((x) => x.stage === name);
  $("stage-title").textContent = "Stage " + name;
  $("stage-title").dataset.stage = name;
  if (!s) {
    $("stage-summary").textContent = "No run of " + name + " in the last day.";
    for (const id of ["stage-done", "stage-failed", "stage-p95", "stage-depth", "stage-day-done", "stage-day-failed"]) $(id).replaceChildren();
    return;
  }
  const h = s.last_hour, d = s.last_day;
  $("stage-summary").textContent = "Last hour: " + h.done + " moved on, " + h.failed + " failed, " + h.waited + " waited; time p50 " + ms(h.p50_ms) +
    ", p95 " + ms(h.p95_ms) + ". Last day: " + d.done + " moved on, " + d.failed + " failed.";
  $("stage-summary").classList.remove("muted");
  drawChart($("stage-done"), s.minutes, "done");
  drawChart($("stage-failed"), s.minutes, "failed");
  drawChart($("stage-p95"), s.minutes, "p95_ms");
  drawChart($("stage-depth"), s.minutes, "depth");
  drawChart($("stage-day-done"), s.hours, "done", "24 h ago");
  drawChart($("stage-day-failed"), s.hours, "failed", "24 h ago");
}

// What a process runs: a link to each job or batch, its stage and for how long.
function runningWork(list) {
  if (!list.length) return ["idle"];
  return list.flatMap((w) => {
    const href = w.kind === "batch" ? "#/batches/" + w.id : w.kind === "job" ? "#/jobs/" + w.id : null;
    const name = href ? link(href, w.id, { "data-running": w.id }) : el("span", { "data-running": w.id }, w.id);
    return [el("div", {}, name, " " + w.stage + ", " + age(w.since_ms))];
  });
}

async function renderProcesses() {
  const list = await api("GET", "/api/v1/processes");
  const alive = list.filter((p) => p.alive).length;
  $("processes-count").textContent = "(" + alive + " alive, " + (list.length - alive) + " gone)";
  keyed($("processes"), JSON.stringify(list.map((p) => [p.name, p.alive, p.heard_at_ms, p.running])), () => list.length
    ? list.map((p) => {
        const state = p.alive ? "alive" : p.stopped_at_ms ? "stopped " + when(p.stopped_at_ms) : "gone: its session ended";
        const stages = Object.entries(p.stages).map(([n, c]) => n + " ×" + c).join(", ");
        return el("tr", { "data-process": p.name, "data-alive": String(p.alive), class: p.alive || p.stopped_at_ms ? "" : "down" },
          el("td", {}, p.host + " pid " + p.pid), el("td", { "data-process-state": p.alive ? "alive" : "gone" }, state),
          el("td", { "data-roles": p.roles.join(" ") }, p.roles.join(", ")), el("td", {}, stages || "none"),
          el("td", {}, p.version), el("td", { title: when(p.started_at_ms) }, ago(p.started_at_ms)),
          el("td", { title: when(p.heard_at_ms) }, ago(p.heard_at_ms)),
          el("td", { "data-process-running": String(p.running.length) },
            ...(p.alive || !p.running.length ? [] : ["was running: "]), ...runningWork(p.running)));
      })
    : [el("tr", {}, el("td", { colspan: "8", class: "muted" }, "no process has announced itself"))]);
}
// Processes and stage figures say nothing on the event stream: their pages read them again
// every 5 s (as often as processes add to them).
setInterval(() => { if (["processes", "stage"].includes(route().view)) refresh(); }, 5000);
// A bulk operation's progress is not an event either: the audit page follows it each second.
setInterval(() => { if (route().view === "audit" && document.querySelector("[data-op-state=running]")) refresh(); }, 1000);

// A re-render while a button is held would replace what is being clicked: it waits for the
// release.
let pending = null, pointerHeld = false, deferred = false;
document.addEventListener("pointerdown", () => { pointerHeld = true; }, true);
document.addEventListener("pointerup", () => {
  pointerHeld = false;
  if (deferred) { deferred = false; setTimeout(refresh, 0); }
}, true);
function refresh() {
  if (pending || !token || !me) return;
  // Set while a re-render is due or running (the browser test clicks only when it is not).
  document.body.dataset.busy = "1";
  pending = setTimeout(async () => {
    pending = null;
    if (pointerHeld) { deferred = true; delete document.body.dataset.busy; return; }
    const { view, arg } = route();
    try {
      if (view === "overview") await renderOverview();
      else if (view === "batches") await renderBatches();
      else if (view === "batch") await renderBatch(arg);
      else if (view === "jobs") await renderJobs();
      else if (view === "job") await renderJob(arg);
      else if (view === "generic") await renderGeneric();
      else if (view === "outbox") await renderOutbox();
      else if (view === "processes") await renderProcesses();
      else if (view === "stage") await renderStage(arg);
      else if (view === "audit") await renderAudit();
      document.body.dataset.rendered = view + ":" + Date.now();
    } catch (e) { showError(e); }
    if (!pending) delete document.body.dataset.busy;
  }, 100);
}

// Server-sent events over fetch (EventSource cannot send the token); resumes from the
// last event id after a break.
let lastId = null;
async function follow() {
  for (;;) {
    if (!token) { await new Promise((ok) => setTimeout(ok, 500)); continue; }
    try {
      const headers = { Authorization: "Bearer " + token };
      if (lastId) headers["Last-Event-ID"] = lastId;
      const r = await fetch("/api/v1/events", { headers });
      if (!r.ok) throw new Error("events: " + r.status);
      $("live").textContent = "live";
      const reader = r.body.getReader();
      const dec = new TextDecoder();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += dec.decode(value, { stream: true });
        let i;
        while ((i = buf.indexOf("\n\n")) >= 0) {
          const block = buf.slice(0, i); buf = buf.slice(i + 2);
          for (const line of block.split("\n")) {
            if (line.startsWith("id:")) lastId = line.slice(3).trim();
          }
          if (/^(event|data):/m.test(block)) refresh();
        }
      }
    } catch (e) { /* fall through to retry */ }
    $("live").textContent = "reconnecting…";
    await new Promise((ok) => setTimeout(ok, 1000));
  }
}

for (const s of JOB_STATES) $("job-state").append(el("option", { value: s }, s));
for (const s of BATCH_STATES) $("batch-state").append(el("option", { value: s }, s));
$("job-state").value = "Failed";
$("job-state").addEventListener("change", searchJobs);
$("failure-kind").addEventListener("change", searchJobs);
$("job-search").addEventListener("click", searchJobs);
for (const i of [$("job-q"), ...document.querySelectorAll("[data-filter]")]) {
  i.addEventListener("keydown", (e) => { if (e.key === "Enter") searchJobs(); });
}
const resetBatches = () => { batchPages.reset(); refresh(); };
$("batch-search").addEventListener("click", resetBatches);
$("batch-state").addEventListener("change", resetBatches);
$("batch-q").addEventListener("keydown", (e) => { if (e.key === "Enter") resetBatches(); });
for (const b of document.querySelectorAll("[data-collection-action]")) {
  b.addEventListener("click", () => {
    const name = $("collection").value.trim();
    if (!name) return showError("name a collection first");
    const hold = b.dataset.collectionAction === "hold";
    act(hold ? "PUT" : "DELETE", "/api/v1/collections/" + encodeURIComponent(name) + "/hold", undefined,
      (r) => hold ? "Collection " + name + " held" : "Collection " + name + " released: " + (r.released || 0) + " batches and jobs back to Pending");
  });
}
// Who the token is; its role decides which pages and controls show.
async function whoAmI() {
  const who = await api("GET", "/api/v1/me");
  me = who;
  document.body.dataset.role = me.role;
  $("whoami").textContent = me.name + " (" + me.role + ")";
  $("nav-batches").textContent = me.role === "admin" ? "Batches" : "My deposits";
  $("submit-profile").replaceChildren(...me.profiles.map((p) => el("option", { value: p.name }, p.name + " (" + p.collection + ")")));
}
const signIn = async () => {
  token = $("token").value.trim();
  if (!token) return showError("paste a token first");
  try { await whoAmI(); }
  catch (e) { token = ""; return showError(e instanceof Unauthorized ? "That token was refused: " + e.message : e); }
  localStorage.setItem("lading-token", token);
  $("token").value = "";
  $("error").hidden = true;
  location.hash = me.role === "admin" ? "#/overview" : "#/batches";
  show();
};
$("save-token").addEventListener("click", signIn);
$("token").addEventListener("keydown", (e) => { if (e.key === "Enter") signIn(); });
// A deposit from the form: one file, uploaded with the profile chosen; then its batch.
$("submit-go").addEventListener("click", async () => {
  const file = $("submit-file").files[0];
  if (!file) return showError("choose a file to submit first");
  const params = new URLSearchParams({ profile: $("submit-profile").value, type: $("submit-type").value });
  if ($("submit-title").value.trim()) params.set("title", $("submit-title").value.trim());
  const form = new FormData();
  form.append("file", file, file.name);
  $("submit-go").disabled = true;
  try {
    const r = await fetch("/api/v1/batches/upload?" + params, { method: "POST", headers: { Authorization: "Bearer " + token }, body: form });
    const data = await r.json().catch(() => null);
    if (!r.ok) throw new Error((data && data.error) || "upload: " + r.status);
    notice("Submitted " + file.name + " as batch " + data.id);
    $("submit-file").value = "";
    location.hash = "#/batches/" + data.id;
  } catch (e) { showError(e); }
  $("submit-go").disabled = false;
});
window.addEventListener("hashchange", show);
// A token kept from before: who it is first, then the page.
if (token) whoAmI().then(show, (e) => { showError(e); show(); }); else show();
follow();
