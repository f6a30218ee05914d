"""What the chaos soak says: a progress line now and then, and at the end its figures as a
table and as JSON (the violations with their details among them).
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections import Counter
from typing import TYPE_CHECKING, Any

from bench.soak_settings import AUX_CLUSTER_NODES
from shared.domain.model import NodeRole

if TYPE_CHECKING:
    from bench.soak import Soak


class Report:
    """The soak's progress lines and figures, read from the runner and its collaborators."""

    def __init__(self, soak: Soak) -> None:
        self.s = soak

    def progress(self) -> None:
        try:
            nodes, jobs = self.s.read_state()
        except sqlite3.OperationalError:
            return
        js = Counter(j.state.value.removeprefix("JOB_STATE_") for j in jobs.values())
        ns = Counter(n.state.value for m in nodes.values() for n in m if n.role is NodeRole.WORKER)
        docs = self.s.fig.doc_samples[-1] if self.s.fig.doc_samples else {}
        self.s.say(f"jobs {dict(sorted(js.items()))} | nodes {dict(sorted(ns.items()))} | "
                   f"faults {sum(v for k, v in self.s.fig.faults.items() if not k.startswith('on '))}"
                   f" kills {sum(self.s.fig.kills.values())} ctl-restarts "
                   f"{self.s.fig.controller_restarts} replays {sum(self.s.fig.replays.values())} | "
                   f"events {docs.get('events', 0)} processed {docs.get('processed_events', 0)} "
                   f"outbox {docs.get('outbox', 0)} | violations {len(self.s.violations)}")

    def figures(self) -> dict[str, Any]:
        finals = Counter(p.final or ("not submitted" if not p.submitted else "unfinished")
                         for p in self.s.jobs.values())
        samples = self.s.fig.doc_samples
        peak = {c: max((s.get(c, 0) for s in samples), default=0)
                for c in ("events", "processed_events", "outbox")}
        return {
            "seed": self.s.seed, "minutes": self.s.duration_s / 60, "jobs": self.s.n_jobs,
            "nodes": self.s.n_nodes, "aux_nodes": AUX_CLUSTER_NODES, "cpus": os.cpu_count(),
            "settled": self.s.settled,
            "jobs_by_final_state": dict(sorted(finals.items())),
            "jobs_cancelled_by_soak": sum(p.cancelled for p in self.s.jobs.values()),
            "job_restarts": self.s.job_restarts,
            "ranks_on_guard_held_nodes": len(self.s.node_checks.held_work),
            "faults_by_kind": dict(sorted(self.s.fig.faults.items())),
            "kills_by_kind": dict(sorted(self.s.fig.kills.items())),
            "replays_by_kind": dict(sorted(self.s.fig.replays.items())),
            "chaos_actions": dict(sorted(self.s.fig.chaos.items())),
            **self.s.teeth.figures(),
            "controller_restarts": self.s.fig.controller_restarts,
            "guard_hold_sightings": self.s.fig.guard_holds,
            "invariant_checks": self.s.fig.checks,
            "checks_by_invariant": dict(sorted(self.s.fig.checks_by_invariant.items())),
            "docs_peak": peak,
            "docs_final": samples[-1] if samples else {},
            "violations": len(self.s.violations),
            "violation_details": [v.to_dict() for v in self.s.violations],
        }

    def report(self) -> None:
        figs = self.figures()
        self.s.last_figures = figs
        if not self.s.quiet:
            rows: list[tuple[str, str]] = []
            for key in ("jobs_by_final_state", "faults_by_kind", "kills_by_kind",
                        "replays_by_kind", "chaos_actions", "storage_and_client_chaos",
                        "api_answers_under_chaos", "checks_by_invariant", "docs_peak"):
                for k, v in figs[key].items():
                    rows.append((f"{key.replace('_', ' ')}: {k}", str(v)))
            for key in ("job_restarts", "controller_restarts", "guard_hold_sightings",
                        "invariant_checks", "settled", "violations"):
                rows.append((key.replace("_", " "), str(figs[key])))
            width = max(len(r[0]) for r in rows)
            print("\n" + "-" * (width + 12))
            for k, v in rows:
                print(f"{k:<{width}}  {v:>8}")
            print("-" * (width + 12))
            for v in self.s.violations:
                print(f"VIOLATION at {v.at:.1f}s [{v.invariant}] {v.detail}")
            print(json.dumps(figs, indent=2))
