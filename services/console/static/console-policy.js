// mtc console, the candidate triage table: its diff report by cause (what it would decide
// differently on live traffic) and its recommendations, with accept / dismiss (through the
// API, audited, like the node actions). policyPanel is pure: view -> the cells to show.
"use strict";

function policyPanel(view) {
  const policy = view.policy || null;
  const diff = view.diff || { evaluated: 0, differing: 0, rows: [], causes: [] };
  const when = (t) => (t ? new Date(t * 1000).toISOString().slice(11, 19) : "");
  const stages = policy ? (policy.stages || []).map((s) => `${s.stage} ${s.cause} on ${s.partition}`) : [];
  return {
    shown: policy !== null,
    stages: policy ? `default ${policy.defaultStage}; ${stages.join(", ") || "no stage rows"}` : "",
    summary: `would decide differently: ${diff.differing} of ${diff.evaluated} reports with a finding; ` +
      `causes: ${(diff.causes || []).join(", ") || "none"}`,
    rows: (diff.rows || []).map((r) => [r.cause, String(r.count),
      `${r.active.failureMode}: ${r.active.action}`, `${r.candidate.failureMode}: ${r.candidate.action}`,
      (r.nodes || []).join(", "), when(r.lastAt)]),
    repairRows: ((view.repairDiff || {}).rows || []).map((r) => [r.cause, String(r.count),
      `${r.active.step}: ${r.active.action}`, `${r.candidate.step}: ${r.candidate.action}`,
      (r.nodes || []).join(", "), when(r.lastAt)]),
    recs: (view.recommendations || []).map((r) => ({
      id: r.id, pending: r.verdict === "pending",
      cells: [r.nodeId, r.cause, r.candidate.action, r.verdict, when(r.deadline), r.by || "", r.reason || ""] })),
  };
}

if (typeof module !== "undefined") module.exports = { policyPanel };

async function loadPolicy() {
  if (!cluster || typeof api !== "function") return;
  let view;
  try { view = await api("policy", { cluster }); } catch (_) { return; }
  const p = policyPanel(view);
  $("policy-section").hidden = !p.shown;
  if (!p.shown) return;
  $("policy-stages").textContent = p.stages;
  $("policy-summary").textContent = p.summary;
  for (const [id, rows] of [["policy-diff", p.rows], ["policy-repair", p.repairRows]]) {
    $(id).tBodies[0].replaceChildren(...rows.map((cells) =>
      el("tr", null, ...cells.map((c) => el("td", null, c)))));
  }
  $("policy-recs").tBodies[0].replaceChildren(...p.recs.map((r) => el("tr", null,
    ...r.cells.map((c) => el("td", null, c)),
    el("td", null, ...(r.pending ? ["accept", "dismiss"].map((verb) => el("button", {
      type: "button", class: "act", "data-action": verb,
      onclick: () => askPolicy(verb, r.id) }, verb)) : [])))));
}

function askPolicy(verb, id) {
  ask(`${verb} recommendation ${id}`, `/v1beta1/${cluster}/triagePolicy:${verb}`);
  pending.body = { recommendation: id };
}

if (typeof document !== "undefined") {
  document.addEventListener("DOMContentLoaded", () => setInterval(loadPolicy, 3000));
}
