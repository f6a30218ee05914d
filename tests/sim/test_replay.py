"""``mtc replay``: a candidate policy tried on a recorded history before it goes live."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from services.cli.main import main as mtc
from shared.adapters.docstore import DocEventLog
from shared.adapters.outbox import envelope_from_doc
from shared.adapters.sqlite_store import SqliteDocStore
from shared.policies.triage_table import DEFAULT_TABLE_PATH
from simulator import history, replay, twin
from simulator.scenario import parse_scenario

# A healthy fleet whose GPUs log the odd lone XID 45 (benign: preemptive cleanup, nothing to
# repair, the job goes on), and a real fault now and then (XID 79: a reboot fixes it).
FLEET: dict[str, Any] = {
    "name": "xid45-noise", "seed": 1, "duration": "4d",
    "cluster": {"cluster_id": "f", "partitions": [{"name": "train", "nodes": 16, "spares": 2}],
                "provision": "5m"},
    "jobs": [{"name": "train", "nodes": 16, "step_time": "10s", "checkpoint_interval": "30m",
              "checkpoint_save": "20s", "startup": "2m"}],
    "failures": {"causes": {
        "xid45_noise": {"per_1000_node_days": 400, "signal": {"xid": [45]}, "fix": "none",
                        "kills_job": False},
        "gpu_off_bus": {"per_1000_node_days": 15, "signal": {"xid": [79]}, "fix": "reboot"},
    }},
    "detection": {"xid": "10s"},
    "bus": {"latency": "50ms"},
}


@pytest.fixture(scope="module")
def recorded() -> list[dict[str, Any]]:
    rows = twin.run(parse_scenario(copy.deepcopy(FLEET))).rows
    return [json.loads(json.dumps(r, default=str)) for r in rows]


def xid45_fatal(tmp: Path) -> Path:
    """The packaged table with one row changed: a lone XID 45 means reboot."""
    text = DEFAULT_TABLE_PATH.read_text()
    row = "{codes: [45], failure_mode: preemptive_cleanup, severity: info, action: none}"
    assert row in text
    policy = tmp / "xid45-fatal"
    policy.mkdir()
    (policy / "triage_table.yaml").write_text(text.replace(
        row, "{codes: [45], failure_mode: preemptive_cleanup, severity: critical, "
             "action: reboot}"))
    return policy


def test_a_candidate_treating_a_lone_xid45_as_fatal_would_cordon_a_healthy_fleet(
        recorded: list[dict[str, Any]], tmp_path: Path) -> None:
    noise = sum(1 for r in recorded if r["type"] == "mtc.node.health_reported.v1"
                and any(45 in (c.get("details") or {}).get("xids", ())
                        for c in r["data"]["conditions"]))
    assert noise >= 20  # the history holds enough lone 45s to matter
    result = replay.replay(recorded, replay.load_policy(xid45_fatal(tmp_path)),
                           replay.load_policy(None))
    base, cand = result.totals["baseline"], result.totals["xid45-fatal"]
    assert base["cordons"] < 10  # the real faults only
    assert cand["cordons"] >= base["cordons"] + 15
    assert cand["holds"] > 0  # so many that the blast-radius guard starts refusing
    changed = [n for n, v in result.per_node.items() if v["baseline"] != v["xid45-fatal"]]
    assert len(changed) >= 10  # most of the 18 nodes
    noise = [d for d in result.differences if d.candidate.failure_mode == "preemptive_cleanup"]
    assert len(noise) >= len(result.differences) - base["cordons"]
    assert all(d.baseline.kind == "none" and d.candidate.kind in ("repair", "hold")
               for d in noise)
    # and a real fault climbs the ladder faster: the node's history holds the 45s' reboots
    assert all(d.baseline.kind == "repair" and d.candidate.kind in ("repair", "hold")
               for d in result.differences if d not in noise)
    # the baseline replay decides what the control plane recorded: one repair per diagnosis
    recorded_repairs = sum(1 for r in recorded if r["type"] == "mtc.node.repair_started.v1"
                           and r["data"]["attempt"] == 1)
    assert base["cordons"] == pytest.approx(recorded_repairs, abs=2)


def test_the_same_policy_changes_nothing(recorded: list[dict[str, Any]]) -> None:
    same = replay.load_policy(None, name="same")
    result = replay.replay(recorded, same, replay.load_policy(None))
    assert result.differences == [] and result.totals["same"] == result.totals["baseline"]


def test_mtc_replay_reads_the_embedded_store_and_prints_the_difference(
        recorded: list[dict[str, Any]], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "state"
    state.mkdir()
    log = DocEventLog(SqliteDocStore(state / "mtc.db"))
    for n, row in enumerate(recorded):
        log.append(envelope_from_doc({**row, "id": f"e{n}", "source": "//twin"}), "ok")
        if n % 7 == 0:  # the log keeps one entry per outcome: read back once
            log.append(envelope_from_doc({**row, "id": f"e{n}", "source": "//twin"}), "dup")
    assert len(history.load_events(state)) == len(recorded)
    policy = xid45_fatal(tmp_path)
    assert mtc(["replay", str(state), "--policy", str(policy), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["totals"]["xid45-fatal"]["cordons"] > out["totals"]["baseline"]["cordons"]
    assert mtc(["replay", str(state), "--policy", str(tmp_path / "nope")]) == 2


@pytest.mark.slow
def test_twin_reports_the_goodput_difference_with_its_interval(
        recorded: list[dict[str, Any]], tmp_path: Path) -> None:
    diff = replay.twin_diff(recorded, replay.load_policy(xid45_fatal(tmp_path)),
                            replay.load_policy(None), replications=3)
    assert diff["replications"] == 3 and diff["ci"] == diff["ci"] > 0  # an interval
    assert diff["difference"] == pytest.approx(diff["candidate_goodput"]
                                               - diff["baseline_goodput"])
    # the twin reboots for every lone 45 under the candidate
    assert diff["candidate_repairs"] > diff["baseline_repairs"] + 10
