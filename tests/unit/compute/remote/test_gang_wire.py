"""``start_workers`` on the wire: one gang per message, its command and env once per pool; a
malformed gang is refused naming the field; an earlier control plane's per-rank form is
still applied, as the same gang."""

from __future__ import annotations

import json
from typing import Any

import pytest

from shared.adapters.compute.remote.codec import (
    ComputeRequest,
    apply,
    decode,
    encode,
    gang_args,
    gang_of_args,
    make_request,
    worker_to_dict,
)
from shared.domain.errors import PermanentError, ValidationError
from shared.ports import Gang, LaunchGroup

ENV = tuple((f"VAR_{i:03d}", "x" * 16) for i in range(80))  # about 2 KB of environment


def gang(ranks: int = 3, env: tuple[tuple[str, str], ...] = (("A", "1"),)) -> Gang:
    """Pool 0: every rank but the last, with ``env``; pool 1: the last rank."""
    nodes = tuple(f"llama-train-{r:05d}" for r in range(ranks))
    groups = (LaunchGroup(0, ranks - 1, ("python3", "-m", "trainer.task", "--tag", ""), env),
              LaunchGroup(ranks - 1, 1, ("python3", "eval.py"), ()))
    return Gang("llama3-405b", 7, nodes, groups, "/out/llama/checkpoints", "/out/llama/model",
                "/out/llama/logs")


class Recorded:
    def __init__(self) -> None:
        self.gangs: list[Gang] = []

    def start_workers(self, g: Gang) -> None:
        self.gangs.append(g)


def over_the_wire(args: dict[str, Any]) -> Gang:
    """``args`` published as a start_workers request, decoded and applied at the executor
    (the request is made by hand: ``make_request`` needs the job and attempt it keys on)."""
    data, attributes = encode(ComputeRequest("start_workers", args, "r1", "job", 10.0, 70.0))
    compute = Recorded()
    apply(decode(data, attributes), compute)  # type: ignore[arg-type]
    [got] = compute.gangs
    return got


def test_a_gang_round_trips() -> None:
    g = gang()
    assert over_the_wire(gang_args(g)) == g
    assert list(over_the_wire(gang_args(g)).workers()) == list(g.workers())


def test_the_per_rank_form_of_an_earlier_control_plane_is_the_same_gang() -> None:
    g = gang(5)
    old = {"workers": [worker_to_dict(w) for w in reversed(list(g.workers()))]}
    assert over_the_wire(old) == g
    assert (make_request("start_workers", old, 1.0, 60.0).request_id
            == make_request("start_workers", gang_args(g), 2.0, 60.0).request_id)


def test_a_2048_rank_restart_is_one_small_message() -> None:
    g = gang(2048, ENV)
    data, _ = encode(make_request("start_workers", gang_args(g), 10.0, 60.0))
    per_rank, _ = encode(make_request(
        "start_workers", {"workers": [worker_to_dict(w) for w in g.workers()]}, 10.0, 60.0))
    assert len(json.dumps(ENV)) > 2000
    assert len(data) < 64 * 1024, len(data)  # one copy of the command and env
    assert len(per_rank) > 4 * 1024 * 1024, len(per_rank)  # 2,048 copies


def broken(path: list[str | int], value: Any) -> dict[str, Any]:
    """``gang_args`` with the field at ``path`` set to ``value`` (``...``: removed)."""
    args = json.loads(json.dumps(gang_args(gang())))
    target = args["gang"]
    for key in path[:-1]:
        target = target[key]
    if value is ...:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return args  # type: ignore[no-any-return]


@pytest.mark.parametrize(("args", "field"), [
    ({"gang": "llama"}, "args.gang"),
    ({}, "args.gang"),
    (broken(["job_id"], ...), "args.gang.job_id"),
    (broken(["job_id"], 7), "args.gang.job_id"),
    (broken(["attempt"], "7"), "args.gang.attempt"),
    (broken(["attempt"], True), "args.gang.attempt"),
    (broken(["node_ids"], "n0,n1"), "args.gang.node_ids"),
    (broken(["node_ids"], []), "args.gang.node_ids"),
    (broken(["node_ids", 1], None), "args.gang.node_ids[1]"),
    (broken(["groups"], []), "args.gang.groups"),
    (broken(["groups", 0], "all"), "args.gang.groups[0]"),
    (broken(["groups", 0, "count"], 0), "args.gang.groups[0].count"),
    (broken(["groups", 1, "first_rank"], ...), "args.gang.groups[1].first_rank"),
    (broken(["groups", 1, "first_rank"], 1), "args.gang.groups"),  # overlaps pool 0
    (broken(["groups", 0, "command"], []), "args.gang.groups[0].command"),
    (broken(["groups", 0, "command", 0], 3), "args.gang.groups[0].command[0]"),
    (broken(["groups", 0, "env", 0], ["A"]), "args.gang.groups[0].env[0]"),
    (broken(["checkpoint_dir"], ...), "args.gang.checkpoint_dir"),
    ({"workers": []}, "args.workers"),
    ({"workers": [worker_to_dict(w) for w in gang().workers()][1:]}, "args.workers"),
])
def test_a_malformed_gang_is_refused_naming_the_field(args: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        gang_of_args(args)
    assert caught.value.path == field, caught.value
    assert isinstance(caught.value, PermanentError)  # the executor refuses it, never retries
    with pytest.raises(ValidationError):
        over_the_wire(args)
