"""The agent's spool: order, coalescing, bounds and the drop policy, crash safety (SIGKILL)."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from services.node_agent.spool import Spool, SpooledReport
from shared.domain.errors import ValidationError

ROOT = Path(__file__).resolve().parents[3]


def data(at: float, status: str = "false", reason: str = "no new XID errors",
         node: str = "n1") -> dict[str, Any]:
    return {"node_id": node, "observed_at": at, "source": "agent",
            "conditions": [{"type": "XidError", "status": status, "reason": reason,
                            "since": at, "details": {}}]}


def fault(at: float, code: int) -> dict[str, Any]:
    return data(at, "true", f"XID {code} on 0000:3b:00")


def test_reports_go_out_oldest_first_and_each_is_deleted_once_accepted(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.db")
    for i, code in enumerate((13, 31, 79)):
        spool.append(f"e{i}", fault(100.0 + i, code))
    sent: list[SpooledReport] = []
    result = spool.flush(sent.append)
    assert (result.sent, result.left) == (3, 0)
    assert [r.event_id for r in sent] == ["e0", "e1", "e2"]
    assert [r.observed_at for r in sent] == [100.0, 101.0, 102.0]  # the original times
    assert spool.stats()["sent"] == 3 and len(spool) == 0


def test_a_failing_transport_keeps_the_report_and_the_order(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.db")
    for i, code in enumerate((13, 31, 79)):
        spool.append(f"e{i}", fault(100.0 + i, code))
    sent: list[str] = []

    def flaky(report: SpooledReport) -> None:
        if report.event_id == "e1":
            raise ConnectionError("bus unreachable")
        sent.append(report.event_id)

    result = spool.flush(flaky)
    assert (result.sent, result.left) == (1, 2) and "bus unreachable" in result.error
    assert spool.flush(lambda r: sent.append(r.event_id)).left == 0
    assert sent == ["e0", "e1", "e2"]  # e2 never overtook e1


def test_a_run_of_identical_reports_keeps_its_first_and_latest(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.db")
    spool.append("fault", fault(99.0, 79))
    for i in range(10):
        spool.append(f"h{i}", data(100.0 + i))
    spool.append("again", fault(200.0, 79))
    kept = [(r.event_id, r.observed_at) for r in spool.pending()]
    assert kept == [("fault", 99.0), ("h0", 100.0), ("h9", 109.0), ("again", 200.0)]
    assert spool.stats()["coalesced"] == 8 and spool.stats()["dropped"] == 0


def test_full_drops_healthy_reports_before_faults_and_counts_them(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.db", max_reports=4)
    spool.append("f1", fault(1.0, 13))
    spool.append("h1", data(2.0, reason="ok a"))
    spool.append("f2", fault(3.0, 31))
    spool.append("h2", data(4.0, reason="ok b"))
    spool.append("f3", fault(5.0, 43))  # full: the oldest healthy one goes
    assert [r.event_id for r in spool.pending()] == ["f1", "f2", "h2", "f3"]
    spool.append("f4", fault(6.0, 45))  # h2 goes
    spool.append("f5", fault(7.0, 48))  # only faults left: the oldest fault goes
    assert [r.event_id for r in spool.pending()] == ["f2", "f3", "f4", "f5"]
    assert spool.stats()["dropped"] == 3 and spool.stats()["queued"] == 4


def test_the_byte_bound_holds(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.db", max_reports=10_000, max_bytes=4096)
    for i in range(200):
        spool.append(f"e{i}", fault(float(i), 1000 + i))
    stats = spool.stats()
    assert stats["queued_bytes"] <= 4096 and stats["dropped"] == 200 - stats["queued"]
    assert spool.pending()[-1].event_id == "e199"  # the newest is never the one dropped


def test_bad_bounds_name_the_field(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="spool_max_reports"):
        Spool(tmp_path / "s.db", max_reports=1)


def test_the_spool_file_is_private(tmp_path: Path) -> None:
    Spool(tmp_path / "s.db")
    assert (tmp_path / "s.db").stat().st_mode & 0o077 == 0


WRITER = r"""
import sys
from services.node_agent.spool import Spool
spool = Spool(sys.argv[1])
i = 0
while True:
    spool.append(f"e{i}", {"node_id": "n1", "observed_at": float(i), "source": "agent",
                           "conditions": [{"type": "XidError", "status": "true",
                                           "reason": f"XID {i}", "since": float(i)}]})
    print(i, flush=True)  # printed only once the append committed
    i += 1
"""


def test_a_killed_agent_loses_no_report_it_had_spooled(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout is not None
    committed = []
    deadline = time.monotonic() + 30
    while len(committed) < 150 and time.monotonic() < deadline:
        committed.append(int(proc.stdout.readline()))
    os.kill(proc.pid, signal.SIGKILL)  # mid-append: it never stops writing
    proc.wait()
    committed += [int(line) for line in proc.stdout.read().split()]
    assert len(committed) >= 150
    con = sqlite3.connect(path)
    assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    con.close()
    spool = Spool(path)
    ids = [r.event_id for r in spool.pending()]
    assert ids[: len(committed)] == [f"e{i}" for i in committed]  # every committed one, in order
    assert len(ids) <= len(committed) + 1  # at most the one in flight, and then whole
