// mtc console: polls /console/api/poll every POLL_MS with the token from sessionStorage.
"use strict";
const POLL_MS = 1500;
const KEY = "mtc-console-token";
const $ = (id) => document.getElementById(id);
let cluster = "";
let jobsOffset = 0;
let drill = null; // {partition, state, offset}
let olderBefore = null;
let timer = null;
let live = false;
let busy = false;

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") e.className = v;
    else if (k.startsWith("data-")) e.setAttribute(k, v);
    else if (k === "onclick") e.addEventListener("click", v);
    else e.setAttribute(k, v);
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

class AuthError extends Error {}

async function api(path, params, as) {
  const token = sessionStorage.getItem(KEY);
  if (!token) throw new AuthError("log in first");
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params || {})) if (v !== "" && v !== null && v !== undefined) q.set(k, v);
  const resp = await fetch(`/console/api/${path}?${q}`, {
    headers: { Authorization: `Bearer ${token}` }, credentials: "omit", cache: "no-store" });
  if (resp.status === 401) throw new AuthError((await resp.json()).error.message);
  if (!resp.ok) {
    let msg = resp.statusText;
    try { msg = (await resp.json()).error.message; } catch (_) { /* not JSON */ }
    throw new Error(msg);
  }
  return as === "blob" ? resp.blob() : resp.json();
}

function showLogin(message) {
  stop();
  $("main").hidden = true; $("logout").hidden = true; $("login").hidden = false;
  $("who").textContent = "";
  $("login-error").textContent = message || "";
  $("token").focus();
}

async function login(ev) {
  ev.preventDefault();
  const token = $("token").value.trim();
  if (!token) { $("login-error").textContent = "paste a token"; return; }
  sessionStorage.setItem(KEY, token);
  $("token").value = "";
  try {
    const me = await api("whoami");
    start(me.principal);
  } catch (e) {
    sessionStorage.removeItem(KEY);
    showLogin(e.message);
  }
}

function start(principal) {
  $("login").hidden = true; $("main").hidden = false; $("logout").hidden = false;
  $("who").textContent = principal;
  stop();
  live = true;
  loop();
}

// the next poll waits POLL_MS, or twice as long as the last answer took: one console never
// keeps the one-threaded server busy (a 16,384-node poll takes seconds)
async function loop() {
  if (!live) return;
  const t0 = performance.now();
  await poll();
  if (live) timer = setTimeout(loop, Math.max(POLL_MS, 2 * (performance.now() - t0)));
}

function stop() { live = false; if (timer) clearTimeout(timer); timer = null; }

function filters() {
  return { node: $("f-node").value.trim(), job: $("f-job").value.trim(),
    type: $("f-type").value, text: $("f-text").value.trim(),
    routine: $("f-routine").checked ? "1" : "" };
}

async function poll() {
  if (busy) return;
  busy = true;
  try {
    const body = await api("poll", { cluster, jobsOffset, limit: 100, ...filters() });
    $("error").textContent = "";
    render(body);
    if (drill) await loadDrill();
    await afterRender(body);
    $("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
  } catch (e) {
    if (e instanceof AuthError) { sessionStorage.removeItem(KEY); showLogin(e.message); }
    else $("error").textContent = `error: ${e.message}`;
  } finally { busy = false; }
}

function render(body) {
  cluster = body.cluster || "";
  renderClusters(body.clusters);
  renderGrid(body.grid || []);
  renderJobs(body.jobs);
  if (olderBefore === null) renderTimeline(body.timeline);
  if (body.sim && $("sim-section").hidden) loadSim();
}

function renderClusters(clusters) {
  const sel = $("cluster-select");
  const tbody = $("clusters").tBodies[0];
  tbody.replaceChildren(...clusters.map((c) => el("tr",
    { class: c.name === cluster ? "selected" : "", "data-cluster": c.id,
      onclick: () => choose(c.name) },
    el("td", {}, c.id), el("td", {}, c.displayName), el("td", { class: "cluster-state" }, c.state),
    el("td", {}, c.project), el("td", {}, c.message || ""))));
  const names = clusters.map((c) => c.name).join("|");
  if (sel.dataset.names !== names) {
    sel.replaceChildren(...clusters.map((c) => el("option", { value: c.name }, c.id)));
    sel.dataset.names = names;
  }
  sel.value = cluster;
}

function choose(name) {
  cluster = name; jobsOffset = 0; drill = null; olderBefore = null;
  $("drill").hidden = true;
  closeJob();
  poll();
}

function nodeCell(n) {
  const badges = [];
  if (n.hold) badges.push(el("span", { class: "badge", title: n.hold }, "hold"));
  if (n.lemon) badges.push(el("span", { class: "badge" }, "lemon"));
  if (n.spare) badges.push(el("span", { class: "badge" }, "spare"));
  const conds = n.conditions.map((c) => c.type + (c.reason ? ` (${c.reason})` : "")).join("; ");
  return el("div", { class: `node st-${n.sinfo}`, "data-node": n.id, "data-state": n.state,
    "data-sinfo": n.sinfo, title: `${n.id}: ${n.state} ${n.reason}` },
  el("span", { class: "id" }, n.id), " ", el("span", { class: "word" }, n.sinfo), ...badges,
  el("span", { class: "detail state" }, n.state + (n.rung ? ` · ${n.rung}` : "")),
  conds ? el("span", { class: "detail" }, conds) : null,
  n.job ? el("span", { class: "detail" }, `job ${n.job}`) : null, nodeActions(n));
}

function renderGrid(parts) {
  const words = ["idle", "alloc", "susp", "drng", "drain", "down", "boot", "fail"];
  $("grid").replaceChildren(...parts.map((p) => {
    const bar = el("div", { class: "bar" });
    for (const w of words) {
      if (!p.counts[w]) continue;
      const s = el("span", { class: `st-${w}`, title: `${w}: ${p.counts[w]}` });
      s.style.width = `${(100 * p.counts[w]) / p.total}%`;
      bar.append(s);
    }
    const counts = el("div", { class: "counts" }, ...words.map((w) => el("button", {
      type: "button", class: `count st-${w}${p.counts[w] ? "" : " zero"}`,
      "data-partition": p.name, "data-word": w,
      onclick: () => openDrill(p.name, w) }, `${w} ${p.counts[w] || 0}`)),
    el("button", { type: "button", onclick: () => openDrill(p.name, "") }, `all ${p.total}`));
    const listed = p.notable.length < p.notableTotal
      ? ` (${p.notable.length} of ${p.notableTotal} listed; use the counts)` : "";
    return el("div", { class: "partition", "data-partition": p.name },
      el("h3", {}, `partition ${p.name}: ${p.inService}/${p.total} in service, ${p.spares} spare`,
        el("span", { class: "muted" }, p.all ? "" : ` · nodes out of service, held or lemons${listed}`)),
      bar, counts, el("div", { class: "nodes" }, ...p.notable.map(nodeCell)));
  }));
}

function openDrill(partition, state) { drill = { partition, state, offset: 0 }; loadDrill(); }

async function loadDrill() {
  if (!drill || !cluster) return;
  const page = await api("nodes", { cluster, partition: drill.partition, state: drill.state,
    offset: drill.offset, size: 100 });
  $("drill").hidden = false;
  $("drill-title").textContent = `partition ${drill.partition}, ${drill.state || "every state"}: ` +
    `${page.total} node(s), from ${page.offset + 1}`;
  $("drill-table").tBodies[0].replaceChildren(...page.nodes.map((n) => el("tr", { "data-node": n.id },
    el("td", {}, n.id), el("td", {}, el("span", { class: `count st-${n.sinfo}` }, n.sinfo)),
    el("td", {}, n.state), el("td", {}, n.reason),
    el("td", {}, n.conditions.map((c) => c.type).join(", ")), el("td", {}, n.rung || ""),
    el("td", {}, n.hold || ""), el("td", {}, n.lemon ? "yes" : ""), el("td", {}, n.spare ? "yes" : ""),
    el("td", {}, n.job || ""), el("td", {}, nodeActions(n)))));
  $("drill-prev").disabled = page.offset === 0;
  $("drill-next").disabled = page.next === null;
  drill.next = page.next;
}

const pct = (x) => (x === null || x === undefined ? "–" : `${x.toFixed(1)} %`);

function renderJobs(jobs) {
  const tbody = $("jobs").tBodies[0];
  if (!jobs) { tbody.replaceChildren(); return; }
  tbody.replaceChildren(...jobs.items.map((j) => {
    const g = j.goodput || {};
    const causes = Object.entries(g.badputByCauseS || {}).map(([k, v]) => `${k} ${v.toFixed(1)} s`);
    const ckpt = j.latestCheckpoint ? `${j.checkpoints} (step ${j.latestCheckpoint.step})` : `${j.checkpoints}`;
    return el("tr", { "data-job": j.id, "data-state": j.state, "data-restarts": j.restarts },
      el("td", {}, el("a", { href: `#job=${encodeURIComponent(j.id)}`, class: "job-link",
        onclick: (ev) => { ev.preventDefault(); openJob(j.id); } }, j.id),
      el("span", { class: "detail muted" }, ` ${j.displayName || ""}`)),
      el("td", { class: `state state-${j.state}` }, j.state.replace("JOB_STATE_", ""),
        j.error ? el("span", { class: "detail job-error", title: j.error }, j.error) : null),
      el("td", { class: "attempts" }, j.attempts), el("td", { class: "restarts" }, j.restarts),
      el("td", {}, ckpt), el("td", {}, j.lostSteps), el("td", {}, `${j.recoveryS} s`),
      el("td", {}, pct(g.scheduling)), el("td", {}, pct(g.runtime)), el("td", {}, pct(g.program)),
      el("td", {}, causes.join(", ") || "–"),
      el("td", {}, j.name && !/SUCCEEDED|FAILED|CANCELL/.test(j.state) ? el("button", {
        type: "button", class: "act", "data-action": "cancel", "data-job": j.id,
        onclick: () => askCancel(j) }, "cancel") : ""));
  }));
  $("jobs-more").hidden = jobs.next === null && jobs.offset === 0;
  $("jobs-more").textContent = jobs.next === null ? "first jobs" : `more jobs (${jobs.total})`;
}

function renderTimeline(tl, append) {
  const list = $("timeline");
  if (!tl) { list.replaceChildren(); return; }
  const items = tl.events.map((e) => el("li", { class: e.kind, "data-type": e.type,
    "data-node": e.node, "data-job": e.job, "data-mode": e.mode || "" },
  el("span", { class: "at" }, new Date(e.time * 1000).toLocaleTimeString()),
  ...(e.mode ? [el("span", { class: "mode" }, e.mode.replace("_", " "))] : []), e.text));
  if (append) list.append(...items); else list.replaceChildren(...items);
  $("timeline-older").hidden = !tl.more && !append;
  $("timeline-older").dataset.before = tl.events.length ? tl.events[tl.events.length - 1].time : "";
}

async function older() {
  const before = $("timeline-older").dataset.before;
  if (!before) return;
  const tl = await api("timeline", { cluster, before, limit: 100, ...filters() });
  olderBefore = Number(before);
  renderTimeline(tl, true);
  if (!tl.more) $("timeline-older").hidden = true;
}

async function loadSim() {
  const project = cluster.split("/")[1] || "";
  let listing;
  try { listing = await api("sim", { project }); } catch (e) { return; }
  $("sim-section").hidden = false;
  $("sim-dir").textContent = listing.dir + (listing.more ? " (first 200 files)" : "");
  $("sim-files").replaceChildren(...listing.files.map((f) => el("li", {
    "data-path": f.path, onclick: () => showSim(f, project) }, `${f.path} (${f.kind}, ${f.bytes} bytes)`)));
  const first = listing.files.find((f) => f.kind === "plot") || listing.files[0];
  if (first) showSim(first, project);
}

async function showSim(f, project) {
  const view = $("sim-view");
  if (f.kind === "plot") {
    const blob = await api("sim/file", { path: f.path, project }, "blob");
    view.replaceChildren(el("h3", {}, f.path), el("img", { src: URL.createObjectURL(blob), alt: f.path }));
    return;
  }
  const t = await api("sim/file", { path: f.path, project });
  view.replaceChildren(el("h3", {}, f.path + (t.truncated ? ` (first ${t.rows.length} of ${t.total} rows)` : "")),
    el("table", { class: "sim-table" }, el("thead", {}, el("tr", {}, ...t.header.map((h) => el("th", {}, h)))),
      el("tbody", {}, ...t.rows.map((r) => el("tr", {}, ...r.map((c) => el("td", {}, c)))))));
}

document.addEventListener("DOMContentLoaded", () => {
  $("login-form").addEventListener("submit", login);
  $("logout").addEventListener("click", () => { sessionStorage.removeItem(KEY); showLogin("logged out"); });
  $("cluster-select").addEventListener("change", (e) => choose(e.target.value));
  $("filters").addEventListener("input", () => { olderBefore = null; poll(); });
  $("filters").addEventListener("submit", (e) => e.preventDefault());
  $("timeline-older").addEventListener("click", older);
  $("drill-prev").addEventListener("click", () => { drill.offset = Math.max(0, drill.offset - 100); loadDrill(); });
  $("drill-next").addEventListener("click", () => { if (drill.next !== null) { drill.offset = drill.next; loadDrill(); } });
  $("drill-close").addEventListener("click", () => { drill = null; $("drill").hidden = true; });
  $("jobs-more").addEventListener("click", () => {
    jobsOffset = $("jobs-more").textContent.startsWith("first") ? 0 : jobsOffset + 20; poll(); });
  if (sessionStorage.getItem(KEY)) {
    api("whoami").then((me) => start(me.principal)).catch((e) => showLogin(e.message));
  } else showLogin("");
});
