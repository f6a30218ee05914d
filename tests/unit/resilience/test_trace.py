"""The fault trace: the packaged ones load, and bad input names its field."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from shared.domain.errors import ValidationError
from shared.resilience.trace import FaultKind, load_trace, packaged_traces, parse_trace

GOOD: dict[str, Any] = {
    "version": 1, "name": "t", "cluster": {"nodes": 4, "spares": 1, "repair": "5s"},
    "job": {"replicas": 4, "min_replicas": 3, "step_time": 0.05, "checkpoint_every": 20},
    "faults": [{"kind": "app_crash", "at": 4, "target": {"rank": 1}},
               {"kind": "xid_79", "after_step": 300, "target": {"node": "bench-h100-002"}}],
}


def test_the_default_trace_has_one_fault_of_each_kind() -> None:
    trace = load_trace()
    assert trace.version == 1
    assert sorted(f.kind for f in trace.faults) == sorted(FaultKind)
    assert trace.job.replicas == 4 and trace.job.min_replicas is not None
    assert {"default", "two-faults", "node-faults"} <= set(packaged_traces())


def test_a_trace_file_reads_like_the_packaged_ones(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(GOOD))
    trace = load_trace(path)
    assert trace.repair_s == 5.0
    assert trace.faults[0].at_s == 4.0 and trace.faults[0].rank == 1
    assert trace.faults[1].after_step == 300 and trace.faults[1].node == "bench-h100-002"


def _bad(edit: Any) -> ValidationError:
    data = copy.deepcopy(GOOD)
    edit(data)
    with pytest.raises(ValidationError) as info:
        parse_trace(data)
    return info.value


@pytest.mark.parametrize(("edit", "path"), [
    (lambda d: d.update(version=2), "version"),
    (lambda d: d.pop("version"), "version"),
    (lambda d: d["faults"][1].update(kind="xid_80"), "faults[1].kind"),
    (lambda d: d["faults"][0]["target"].update(rank=4), "faults[0].target.rank"),
    (lambda d: d["faults"][0].update(after_step=3), "faults[0].at"),
    (lambda d: d["faults"][0].update(at="soon"), "faults[0].at"),
    (lambda d: d["faults"][0].update(when=3), "faults[0].when"),
    (lambda d: d["faults"][1].pop("target"), "faults[1].target"),
    (lambda d: d["job"].update(replicas=5), "job.replicas"),
    (lambda d: d["job"].update(min_replicas=0), "job.min_replicas"),
    (lambda d: d["cluster"].update(nodes=0), "cluster.nodes"),
    (lambda d: d["job"].update(tier1_every=21), "job.tier1_every"),
    (lambda d: d.update(faults=[]), "faults"),
])
def test_a_bad_field_is_named(edit: Any, path: str) -> None:
    assert _bad(edit).path == path


def test_no_spare_needs_an_elastic_job() -> None:
    def edit(d: dict[str, Any]) -> None:
        d["job"].pop("min_replicas")
        d["faults"][0]["kind"] = "no_spare_elastic"

    err = _bad(edit)
    assert err.path == "faults[0].kind" and "min_replicas" in err.reason


def test_an_unreadable_trace_names_the_option(tmp_path: Path) -> None:
    with pytest.raises(ValidationError) as info:
        load_trace(tmp_path / "missing.yaml")
    assert info.value.path == "--trace"
    (tmp_path / "broken.yaml").write_text("version: [1\n")
    with pytest.raises(ValidationError) as info:
        load_trace(tmp_path / "broken.yaml")
    assert info.value.path == "--trace"
