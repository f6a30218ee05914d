"""``Gang``: one value per job attempt, its per-rank view, and what makes one invalid; and
``gang(job, deps)``, the scheduler's builder of it."""

from __future__ import annotations

from typing import Any

import pytest

from services.job_submission import commands as job_commands
from services.job_submission import scheduling
from shared.domain.events import JobStarted
from shared.ports import Gang, LaunchGroup, WorkerSpec
from tests.harness import Plane, job_body

TRAIN = LaunchGroup(0, 2, ("python3", "train.py"), (("A", "1"),))
EVAL = LaunchGroup(2, 1, ("python3", "eval.py"), ())


def two_pools(**changes: Any) -> Gang:
    fields: dict[str, Any] = dict(job_id="j", attempt=3, node_ids=("n0", "n1", "n2"),
                                  groups=(TRAIN, EVAL), checkpoint_dir="/o/checkpoints",
                                  model_dir="/o/model", tensorboard_dir="/o/logs")
    return Gang(**(fields | changes))


def test_workers_are_the_ranks_pool_after_pool() -> None:
    gang = two_pools()
    assert gang.world_size == 3
    assert list(gang.workers()) == [
        WorkerSpec("j", 3, 0, 3, "n0", ("python3", "train.py"), (("A", "1"),),
                   "/o/checkpoints", "/o/model", "/o/logs"),
        WorkerSpec("j", 3, 1, 3, "n1", ("python3", "train.py"), (("A", "1"),),
                   "/o/checkpoints", "/o/model", "/o/logs"),
        WorkerSpec("j", 3, 2, 3, "n2", ("python3", "eval.py"), (),
                   "/o/checkpoints", "/o/model", "/o/logs"),
    ]
    assert gang == two_pools() and hash(gang) == hash(two_pools())


@pytest.mark.parametrize(("changes", "problem"), [
    ({"groups": (TRAIN,)}, "groups cover 2 ranks, node_ids 3"),
    ({"groups": (TRAIN, EVAL, LaunchGroup(3, 1, ("x",), ()))}, "groups cover 4 ranks, node_ids 3"),
    ({"groups": (EVAL, TRAIN)}, r"groups\[0\].first_rank is 2, expected 0"),
    ({"groups": (TRAIN, LaunchGroup(1, 2, ("x",), ()))}, r"groups\[1\].first_rank is 1, expected 2"),
    ({"groups": (TRAIN, LaunchGroup(2, 0, ("x",), ()), EVAL)}, r"groups\[1\].count is 0"),
    ({"node_ids": (), "groups": ()}, "no ranks"),
])
def test_groups_must_cover_every_rank_exactly_once(changes: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        two_pools(**changes)


def two_pool_body() -> dict[str, Any]:
    body = job_body(2)
    train = body["jobSpec"]["workerPoolSpecs"][0]
    train["containerSpec"]["env"] = [{"name": "A", "value": "1"}]
    evaluate = {"machineSpec": train["machineSpec"], "replicaCount": 1,
                "pythonPackageSpec": {"executorImageUri": "local", "packageUris": [],
                                      "pythonModule": "trainer.eval", "args": ["--fast"]}}
    body["jobSpec"]["workerPoolSpecs"].append(evaluate)
    return body


def test_the_scheduler_starts_one_gang_per_attempt_with_a_group_per_pool() -> None:
    plane = Plane().up()
    plane.api(lambda u, d: job_commands.submit_job("c1", two_pool_body(), u, d, "j1"))
    plane.deliver()
    job = plane.job("j1")
    [gang] = plane.compute.gangs
    python = plane.deps.config.python
    assert (gang.job_id, gang.attempt, gang.node_ids) == ("j1", 1, tuple(job.node_ids))
    node = (32_768, 1872 << 30)  # an a3-highgpu-8g's processes and memory (job_limits)
    assert gang.groups == (
        LaunchGroup(0, 2, ("python3", "train.py"), (("A", "1"),), node),
        LaunchGroup(2, 1, (python, "-m", "trainer.eval", "--fast"), (), node))
    assert gang.checkpoint_dir.endswith("/j1/checkpoints") and gang.model_dir.endswith("/j1/model")
    [started] = [e.event for e in plane.delivered if isinstance(e.event, JobStarted)]
    assert started.node_ids == gang.node_ids
    assert [w.rank for w in plane.compute.started] == [0, 1, 2]  # the per-rank view

    job.node_ids = job.node_ids[:2]  # fewer nodes than ranks: refused, as before
    with pytest.raises(ValueError, match="j1: 2 nodes for 3 ranks"):
        scheduling.gang(job, plane.deps)
