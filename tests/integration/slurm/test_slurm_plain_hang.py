"""A hang in a plain program on the real Slurm cluster, seen from the node (``node_hangs``).

Two ranks of a program that imports nothing of mtc (a gloo all-reduce per step) run as one
Slurm job; the test SIGSTOPs rank 1's processes. The node agent of rank 1's node finds them
by their environment, sees them stopped past the default limit, and reports ``HangInJob`` on
its node naming rank 1; triage restarts the job, long before the 30-minute watchdog.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from services.cli.demo_slurm import cluster_spec
from services.job_submission import commands as job_commands
from services.wiring.embedded import EmbeddedApp
from shared.adapters.compute.node_hangs import managed_processes
from shared.domain.events import JobSignalled, NodeHealthReported
from tests.integration.test_plain_hang import GLOO, spec

from .conftest import Cluster, timing
from .test_e2e_selfheal import create, get_job, make_app, run_until  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.integration, pytest.mark.slow]
JOB = "plain-hang"
def rank_procs(rank: int) -> dict[int, str]:
    """pid -> mtc node of every process of the job's ``rank`` on this host."""
    return {pid: env.node_id for pid, _, env in managed_processes()
            if env.job_id == JOB and env.rank == rank}


def events(app: EmbeddedApp, type_: str) -> list[dict[str, Any]]:
    assert app.deps.event_log is not None
    return [d["data"] for d in app.deps.event_log.read() if d["type"] == type_]


def hangs(app: EmbeddedApp) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return [(e, c) for e in events(app, NodeHealthReported.TYPE) for c in e["conditions"]
            if c["type"] == "HangInJob" and c["status"] == "true"]


def test_a_stopped_rank_of_a_plain_program_on_slurm_is_named_and_the_job_restarts(
        cluster: Cluster, make_app: Callable[..., EmbeddedApp],  # noqa: F811
        tmp_path: Path) -> None:
    pytest.importorskip("torch")
    program = tmp_path / "plain.py"
    program.write_text(GLOO)
    app = make_app()
    create(app, cluster_spec("it-hang"))
    with app.transaction() as uow:
        job_commands.submit_job("it-hang", spec(program), uow, app.deps, JOB)
    log = app.compute.job_log(JOB)
    run_until(app, "both ranks stepping", lambda: log.exists() and all(
        f"rank {r} step 20" in log.read_text() for r in (0, 1)), timeout_s=120)
    victims = rank_procs(1)
    assert victims and len(set(victims.values())) == 1, victims
    (node,) = set(victims.values())
    stopped_at = time.time()
    try:
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        restarted = run_until(app, "the job's second attempt",
                              lambda: get_job(app, JOB).attempt >= 2, timeout_s=90)
    finally:
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    ((report, cond),) = hangs(app)
    assert report["node_id"] == node and report["source"] == "agent"
    details = cond["details"]
    assert details["culprit"] == 1 and details["node"] == node and details["job_id"] == JOB
    assert "rank 1 process" in cond["reason"] and "stopped" in cond["reason"]
    assert node in cond["reason"]
    assert "<module>" in details["stack"] or details["stack"].startswith("stack: unknown (")
    signalled = [e for e in events(app, JobSignalled.TYPE) if e["job_id"] == JOB]
    assert signalled and signalled[0]["reason"].startswith("hang_in_job"), signalled
    detected = report["observed_at"] - stopped_at
    assert detected <= 20.0 + 5.0, detected  # the default stopped limit, plus a few ticks
    timing("plain rank SIGSTOPped to HangInJob from its node's agent", detected)
    timing("plain rank SIGSTOPped to the job's second attempt", restarted)
    print(f"{cond['reason']}\n{details['stack']}")
