// mtc console, part two: actions (through the API itself: its permission check and audit
// record), the job page, charts over time (inline SVG), and tables that sort and filter.
"use strict";
const SVG = "http://www.w3.org/2000/svg";
let jobOpen = null; // the job id whose page is open
let lastCharts = 0;
const sorts = {}; // table id -> {col, dir}
let pending = null; // the action the dialog asks a reason for

// ------------------------------------------------------------------ actions

const NODE_VERBS = { drain: "drain", resume: "resume", releaseHold: "release hold",
  returnToService: "return to service" };

function nodeActions(n) {
  const verbs = [];
  if (n.held) verbs.push("releaseHold");
  if (n.operatorDrained) verbs.push("resume");
  else if (n.state !== "failed" && n.state !== "retired") verbs.push("drain");
  if (n.state === "failed" && !n.operatorDrained) verbs.push("returnToService");
  return el("span", { class: "actions" }, ...verbs.map((v) => el("button", {
    type: "button", class: "act", "data-action": v, "data-node": n.id,
    onclick: (ev) => { ev.stopPropagation(); askNode(v, n.id); } }, NODE_VERBS[v])));
}

function askNode(verb, node) {
  ask(`${NODE_VERBS[verb]} node ${node}`,
    `/v1beta1/${cluster}/nodes/${encodeURIComponent(node)}:${verb}`);
}

function askCancel(job) {
  if (!job.name) return;
  ask(`cancel job ${job.id}`, `/v1/${job.name}:cancel`);
}

function ask(what, path) {
  pending = { what, path };
  $("action").hidden = false;
  $("action-what").textContent = what;
  $("action-result").textContent = "";
  $("action-result").className = "";
  $("action-reason").value = "";
  $("action-reason").focus();
}

async function act(ev) {
  ev.preventDefault();
  if (!pending) return;
  const reason = $("action-reason").value.trim();
  const out = $("action-result");
  if (!reason) { out.textContent = "say why: the reason goes in the audit record"; out.className = "error"; return; }
  const resp = await fetch(pending.path, { method: "POST", credentials: "omit", cache: "no-store",
    headers: { Authorization: `Bearer ${sessionStorage.getItem(KEY)}`, "Content-Type": "application/json" },
    body: JSON.stringify({ ...(pending.body || {}), reason }) });
  let body = {};
  try { body = await resp.json(); } catch (_) { /* not JSON */ }
  if (resp.ok) {
    out.textContent = `done: ${pending.what} (audited, reason: ${reason})`;
    out.className = "ok";
    out.dataset.status = resp.status;
    pending = null;
    poll();
  } else {
    const err = body.error || {};
    out.textContent = `refused: ${resp.status} ${err.status || ""}: ${err.message || resp.statusText}`;
    out.className = "error";
    out.dataset.status = resp.status;
  }
}

function renderHeld(held) {
  const box = $("held");
  if (!held || !held.count) { box.hidden = true; box.replaceChildren(); return; }
  box.hidden = false;
  const n = held.count;
  box.replaceChildren(el("strong", {}, `${n} repair${n > 1 ? "s" : ""} held by the blast-radius guard`),
    ": the node keeps running its job with a fault. ",
    ...held.nodes.map((id) => el("button", { type: "button", class: "act", "data-action": "releaseHold",
      "data-node": id, onclick: () => askNode("releaseHold", id) }, `release ${id}`)));
}

function renderRollout(r) {
  const box = $("rollout");
  if (!r) { box.hidden = true; box.replaceChildren(); return; }
  box.hidden = false;
  const version = Object.entries(r.version).map(([k, v]) => `${k} ${v}`).join(", ");
  box.replaceChildren(el("strong", {}, `rollout ${r.id} (${version}): ${r.state}`),
    ` · wave ${r.wave} of ${r.waves} (sizes ${r.waveSizes.join(", ")})`,
    r.reason ? ` · ${r.reason}` : "");
}

// ------------------------------------------------------------------ the job page

function openJob(id) { jobOpen = id; location.hash = `job=${encodeURIComponent(id)}`; loadJob(); }

function closeJob() { jobOpen = null; $("job-page").hidden = true; history.replaceState(null, "", location.pathname); }

const secs = (x) => (x === null || x === undefined ? "–" : `${Number(x).toFixed(1)} s`);

async function loadJob() {
  if (!jobOpen || !cluster) return;
  const page = await api("job", { cluster, job: jobOpen });
  const j = page.job;
  const g = j.goodput || {};
  $("job-page").hidden = false;
  $("job-page").dataset.job = j.id;
  $("job-page").dataset.state = j.state;
  $("job-title").textContent = `job ${j.id} ${j.displayName ? `(${j.displayName})` : ""}`;
  $("job-summary").replaceChildren(
    el("span", { class: `state state-${j.state}` }, j.state.replace("JOB_STATE_", "")),
    ` · attempts ${j.attempts} · restarts ${j.restarts} · checkpoints ${j.checkpoints}`,
    ` · lost steps ${j.lostSteps} · recovery ${secs(j.recoveryS)} · goodput: scheduling ${pct(g.scheduling)},`,
    ` runtime ${pct(g.runtime)}, program ${pct(g.program)}, overall ${pct(g.overall)}`,
    // replaceChildren writes a null as the text "null": an ended job's absent button is none
    ...(j.name && !j.state.match(/SUCCEEDED|FAILED|CANCELLED/) ? [el("button", { type: "button",
      class: "act", id: "job-cancel", "data-action": "cancel", onclick: () => askCancel(j) }, "cancel job")] : []));
  $("job-error").textContent = j.error ? `why it failed: ${j.error}` : "";
  $("job-queue").textContent = j.queue ? `team ${j.queue.team}'s queue on ${j.queue.partition}, `
    + `position ${j.queue.position}: ${j.queue.reason}` : "";
  fill("job-attempts", page.attempts.map((a) => [a.attempt, a.started, a.nodes.join(" "),
    a.resume,
    a.exitCode === null ? "" : `exit ${a.exitCode}${a.detail ? `: ${a.detail}` : ""}`]));
  fill("job-incidents", page.incidents.map((i) => [i.attempt, i.at,
    el("span", { class: "mode" }, (i.mode || "").replace("_", " ")), i.incident || "", secs(i.recoveryS),
    i.reason || ""]), (tr, i) => { tr.dataset.mode = page.incidents[i].mode || ""; });
  const logs = $("job-logs");
  if (!page.logsKept) logs.replaceChildren(el("p", { class: "muted" }, "this compute keeps no worker logs"));
  else logs.replaceChildren(el("p", { class: "muted" }, page.logs.attempt === null ? "no output yet"
    : `attempt ${page.logs.attempt}, the last lines of each rank (following live)`),
  ...page.logs.ranks.map((r) => el("div", { class: "rank-log", "data-rank": r.rank === null ? "all" : r.rank },
    el("h4", {}, `${r.rank === null ? "every rank" : `rank ${r.rank}`}${r.ended ? " (exited)" : ""}`),
    el("pre", {}, r.lines.join("\n")))));
  applyTable("job-attempts"); applyTable("job-incidents");
}

function fill(id, rows, each) {
  $(id).tBodies[0].replaceChildren(...rows.map((cells, i) => {
    const tr = el("tr", {}, ...cells.map((c) => el("td", {}, c)));
    if (each) each(tr, i);
    return tr;
  }));
}

// ------------------------------------------------------------------ charts (inline SVG)

function svg(tag, attrs, ...children) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}

const W = 420, H = 140, PAD = 30;

function frame(title, t0, t1, ymax, unit) {
  const s = svg("svg", { viewBox: `0 0 ${W} ${H + 20}`, width: W, height: H + 20, role: "img" });
  s.append(svg("title", {}, title), svg("text", { x: PAD, y: 12, class: "chart-title" }, title),
    svg("line", { x1: PAD, y1: H, x2: W - 5, y2: H, stroke: "#889" }),
    svg("line", { x1: PAD, y1: 18, x2: PAD, y2: H, stroke: "#889" }),
    svg("text", { x: 2, y: 24, class: "tick" }, `${ymax}${unit}`), svg("text", { x: 2, y: H, class: "tick" }, `0`),
    svg("text", { x: PAD, y: H + 14, class: "tick" }, new Date(t0 * 1000).toLocaleTimeString()),
    svg("text", { x: W - 70, y: H + 14, class: "tick" }, new Date(t1 * 1000).toLocaleTimeString()));
  return s;
}

function scaler(t0, t1, ymax) {
  const x = (t) => PAD + ((W - PAD - 5) * (t - t0)) / Math.max(1e-9, t1 - t0);
  const y = (v) => H - ((H - 20) * v) / Math.max(1e-9, ymax);
  return [x, y];
}

function nodesChart(h) {
  const words = ["idle", "alloc", "susp", "drng", "drain", "down", "boot", "fail"];
  const colors = { idle: "#2e9d57", alloc: "#2f6fd6", susp: "#b08900", drng: "#e07b00",
    drain: "#c25e00", down: "#c62828", boot: "#7a8594", fail: "#7b1010" };
  const t = h.times, t0 = t[0], t1 = t[t.length - 1];
  const totals = t.map((_, i) => words.reduce((a, w) => a + h.nodes[w][i], 0));
  const ymax = Math.max(1, ...totals);
  const [x, y] = scaler(t0, t1, ymax);
  const s = frame("nodes by state", t0, t1, ymax, "");
  s.id = "chart-nodes";
  const base = t.map(() => 0);
  for (const w of words) {
    if (!h.nodes[w].some((v) => v > 0)) continue;
    const top = base.map((b, i) => b + h.nodes[w][i]);
    const pts = t.map((ti, i) => `${x(ti)},${y(top[i])}`).concat(
      t.map((ti, i) => `${x(ti)},${y(base[i])}`).reverse());
    s.append(svg("polygon", { points: pts.join(" "), fill: colors[w], "data-word": w },
      svg("title", {}, `${w}: now ${h.nodes[w][t.length - 1]}`)));
    top.forEach((v, i) => { base[i] = v; });
  }
  return s;
}

function goodputChart(h) {
  const t = h.times, t0 = t[0], t1 = t[t.length - 1];
  const [x, y] = scaler(t0, t1, 100);
  const s = frame("runtime goodput of running jobs", t0, t1, 100, "%");
  s.id = "chart-goodput";
  const pts = t.map((ti, i) => [ti, h.goodput[i]]).filter(([, v]) => v !== null);
  if (pts.length) s.append(svg("polyline", { points: pts.map(([ti, v]) => `${x(ti)},${y(v)}`).join(" "),
    fill: "none", stroke: "#2f6fd6", "stroke-width": 2, "data-points": pts.length }));
  return s;
}

function drainChart(h) {
  const t = h.times, t0 = t[0], t1 = t[t.length - 1];
  const ymax = Math.max(1, ...h.faultToDrain.map((d) => Math.ceil(d.seconds)));
  const [x, y] = scaler(t0, t1, ymax);
  const s = frame("fault to drain", t0, t1, ymax, " s");
  s.id = "chart-drain";
  for (const d of h.faultToDrain) {
    s.append(svg("circle", { cx: x(d.time), cy: y(d.seconds), r: 4, fill: "#c62828", class: "drain-point" },
      svg("title", {}, `${d.seconds.toFixed(1)} s`)));
  }
  return s;
}

async function loadCharts(force) {
  if (!cluster || (!force && Date.now() - lastCharts < 5000)) return;
  lastCharts = Date.now();
  const h = await api("history", { cluster, windowS: $("chart-window").value });
  const box = $("charts");
  box.dataset.samples = h.samples;
  if (!h.enabled || h.times.length < 2) {
    box.replaceChildren(el("p", { class: "muted" }, h.enabled ? "collecting history (a sample every " +
      `${h.intervalS} s)…` : "no history store on this server"));
    return;
  }
  box.replaceChildren(nodesChart(h), goodputChart(h), drainChart(h));
}

// ------------------------------------------------------------------ tables that sort and filter

function cellValue(td) {
  const text = td ? td.innerText.trim() : "";
  const n = parseFloat(text);
  return Number.isNaN(n) || !/^[-\d.]/.test(text) ? text.toLowerCase() : n;
}

function applyTable(id) {
  const table = $(id);
  if (!table) return;
  const input = document.querySelector(`input.table-filter[data-table='${id}']`);
  const word = input ? input.value.trim().toLowerCase() : "";
  const rows = [...table.tBodies[0].rows];
  for (const r of rows) r.hidden = word !== "" && !r.innerText.toLowerCase().includes(word);
  const s = sorts[id];
  [...table.tHead.rows[0].cells].forEach((th, i) => {
    th.dataset.sort = s && s.col === i ? s.dir : "";
  });
  if (!s) return;
  rows.sort((a, b) => {
    const va = cellValue(a.cells[s.col]), vb = cellValue(b.cells[s.col]);
    const c = typeof va === typeof vb ? (va < vb ? -1 : va > vb ? 1 : 0) : (typeof va === "number" ? -1 : 1);
    return s.dir === "asc" ? c : -c;
  });
  table.tBodies[0].append(...rows);
}

function sortable(id) {
  const table = $(id);
  [...table.tHead.rows[0].cells].forEach((th, i) => {
    th.classList.add("sortable");
    th.addEventListener("click", () => {
      const s = sorts[id];
      sorts[id] = { col: i, dir: s && s.col === i && s.dir === "asc" ? "desc" : "asc" };
      applyTable(id);
    });
  });
  const input = document.querySelector(`input.table-filter[data-table='${id}']`);
  if (input) input.addEventListener("input", () => applyTable(id));
}

// called by console.js after each poll's render
function ms(s) { return s === null || s === undefined ? "–" : `≤${Math.round(s * 1000)} ms`; }

async function loadEndpoints() {
  let body;
  try { body = await api("endpoints"); } catch (e) { return; }
  const rows = [];
  for (const e of body.endpoints) {
    for (const d of e.deployedModels.length ? e.deployedModels : [null]) {
      const reps = d ? d.replicas.map((r) => `${r.node || "–"} ${r.state}`).join(", ") : "–";
      const reqs = d ? Object.entries(d.requests).map(([c, n]) => `${c}: ${n}`).join(", ") : "";
      rows.push(el("tr", { "data-endpoint": e.id, "data-deployed": d ? d.id : "" },
        el("td", {}, e.id, el("span", { class: "detail muted" }, ` ${e.displayName}`)),
        el("td", {}, d ? d.id : "–"), el("td", {}, d ? d.model : "–"),
        el("td", {}, d ? `${d.traffic}%` : "–"),
        el("td", { class: "replicas", "data-ready": d ? d.replicas.filter((r) => r.state === "READY").length : 0 }, reps),
        el("td", {}, reqs || "–"), el("td", {}, d ? ms(d.p50S) : "–"),
        el("td", {}, d ? ms(d.p99S) : "–")));
    }
  }
  $("endpoints").tBodies[0].replaceChildren(...rows);
  $("endpoints-section").hidden = rows.length === 0;
}

async function afterRender(body) {
  renderHeld(body.held);
  await loadEndpoints();
  renderRollout(body.rollout);
  for (const id of ["clusters", "jobs", "drill-table"]) applyTable(id);
  await loadCharts(false);
  if (jobOpen) await loadJob();
}

document.addEventListener("DOMContentLoaded", () => {
  for (const id of ["clusters", "jobs", "drill-table", "job-attempts", "job-incidents"]) sortable(id);
  $("action").addEventListener("submit", act);
  $("action-close").addEventListener("click", () => { pending = null; $("action").hidden = true; });
  $("job-close").addEventListener("click", closeJob);
  $("chart-window").addEventListener("change", () => loadCharts(true));
  const m = location.hash.match(/^#job=(.+)$/);
  if (m) jobOpen = decodeURIComponent(m[1]);
});
