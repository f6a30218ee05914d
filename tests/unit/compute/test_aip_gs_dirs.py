"""A job's ``AIP_*_DIR`` as Vertex names them where its rank sees Cloud Storage at ``/gcs/``
(the local sandbox): the host's directory under ``<output root>/gcs`` is told as
``gs://BUCKET/PATH/...``, the program maps it back with ``mtc_program.protocol.local_path``,
and the control plane and the launcher keep the host's paths."""

from __future__ import annotations

import json
import os
import sqlite3
import sys
from pathlib import Path

import pytest

from mtc_program import protocol as p
from mtc_program.env import ManagedEnv
from shared.adapters.clock import SystemClock
from shared.adapters.compute import worker_launcher
from shared.adapters.compute.local import sandbox, standby
from shared.adapters.compute.local.compute import LocalCompute
from shared.adapters.compute.protocol import gcs_uri, host_dir, managed_env
from shared.ports import WorkerSpec


def _spec(base: Path) -> WorkerSpec:
    return WorkerSpec("j1", 1, 0, 1, "n0", ("python", "-c", "pass"), (),
                      str(base / "checkpoints"), str(base / "model"), str(base / "logs"))


@pytest.mark.parametrize(("value", "path"), [
    ("gs://b/runs/1/model/", "/gcs/b/runs/1/model/"),
    ("gs://b/runs/1/model", "/gcs/b/runs/1/model"),
    ("/srv/out/j1/model", "/srv/out/j1/model"),  # unsandboxed, Slurm, by hand: itself
    ("", ""),
])
def test_a_gs_uri_is_its_gcs_path(value: str, path: str) -> None:
    assert p.local_path(value) == path


def test_the_host_directory_is_told_as_vertex_tells_it(tmp_path: Path) -> None:
    root = str(tmp_path / "gcs")
    model = str(tmp_path / "gcs" / "b" / "runs" / "1" / "model")
    assert gcs_uri(model, root) == "gs://b/runs/1/model/"  # Vertex's trailing slash
    assert host_dir(gcs_uri(model, root), root) == model
    assert gcs_uri(model, None) == model  # no /gcs/ for the rank: the host's path
    assert gcs_uri(f"{root}/b", root) == "gs://b/"  # a bucket's root (a base output of gs://b)
    for outside in (str(tmp_path / "j1" / "model"), root, f"{root}x/b/m"):
        assert gcs_uri(outside, root) == outside  # not in the gs:// tree
    assert host_dir("/srv/j1/model", root) == "/srv/j1/model"
    assert host_dir("gs://b/runs/1/model/", None) == "gs://b/runs/1/model/"


def test_the_managed_environment_names_gs_uris_and_the_program_reads_files(tmp_path: Path
                                                                            ) -> None:
    root = tmp_path / "gcs"
    spec = _spec(root / "b" / "runs" / "1")
    env = managed_env(spec, gcs_root=str(root))
    assert [env[n] for n in p.JOB_DIRS] == [
        "gs://b/runs/1/checkpoints/", "gs://b/runs/1/model/", "gs://b/runs/1/logs/"]
    job = json.loads(env[p.CLUSTER_SPEC])["job"]
    assert job["base_output_directory"] == "gs://b/runs/1/"
    # mtc's own files stay where the sandbox binds them at their host paths
    assert env[p.ADVICE_FILE].startswith(str(root / "b" / "runs" / "1"))
    read = ManagedEnv.read(env)
    assert read.model_dir == Path("/gcs/b/runs/1/model")
    assert read.checkpoint_dir == Path("/gcs/b/runs/1/checkpoints")
    assert read.tensorboard_dir == Path("/gcs/b/runs/1/logs")
    plain = managed_env(spec)  # unsandboxed: the host's paths, read as they are
    assert plain[p.MODEL_DIR] == spec.model_dir
    assert ManagedEnv.read(plain).model_dir == Path(spec.model_dir)


@pytest.mark.parametrize("sandboxed", [True, False])
def test_only_a_sandboxed_rank_is_told_gs_uris(tmp_path: Path, sandboxed: bool) -> None:
    out = tmp_path / "jobs"
    compute = LocalCompute(tmp_path / "state", lambda _: None, SystemClock(), heartbeats=False,
                           sandboxed=sandboxed, output_root=out)
    try:
        spec = _spec(out / "gcs" / "b" / "p")
        env = compute.worker_env(spec)
        want = "gs://b/p/model/" if sandboxed else spec.model_dir
        assert env[p.MODEL_DIR] == want
        local = compute.worker_env(_spec(out / "j1"))  # no gs:// output: a local path
        assert local[p.MODEL_DIR] == str(out / "j1" / "model")
    finally:
        compute.close()


@pytest.mark.skipif(not sys.platform.startswith("linux") or os.geteuid() != 0,
                    reason="plan_file prepares (chowns) the job's directories: root only")
def test_the_sandbox_plan_keeps_the_host_paths_for_the_launcher(tmp_path: Path) -> None:
    out = tmp_path / "jobs"
    spec = _spec(out / "gcs" / "b" / "p")
    run = tmp_path / "state" / "run" / "j1"
    run.mkdir(parents=True)
    db = sqlite3.connect(":memory:")
    db.executescript(sandbox.SCHEMA)
    env = managed_env(spec, gcs_root=str(out / "gcs"))
    made = sandbox.plan_file(db, spec, env, run / "attempt-1-rank-0.exit", run_as=None,
                             hidden=[str(tmp_path / "state")], python=sys.executable,
                             output_root=str(out), uid_registry=tmp_path / "uids.sqlite")
    plan = json.loads(made.read_text())
    assert plan["dirs"] == [spec.checkpoint_dir, spec.model_dir, spec.tensorboard_dir]
    binds = {dst: src for src, dst, *_ in plan["binds"]}
    assert binds["/gcs/b/p/model"] == spec.model_dir  # the same objects at /gcs/


def test_the_launcher_reads_the_host_paths_not_the_gs_uris(tmp_path: Path) -> None:
    ckpt = tmp_path / "jobs" / "gcs" / "b" / "p" / "checkpoints"
    ckpt.mkdir(parents=True)
    exit_file = str(tmp_path / "run" / "rank-0.exit")
    env = {p.CHECKPOINT_DIR: "gs://b/p/checkpoints/"}
    found = worker_launcher.disk_readings(exit_file, env, [str(ckpt)])
    assert found["space"][0][0] == str(ckpt)  # type: ignore[index]
    assert all(not str(s[0]).startswith("gs:") for s in found["space"])  # type: ignore[attr-defined]


def test_a_standby_is_planned_with_the_host_paths(tmp_path: Path) -> None:
    """A warm standby is started from its job's rank environment (``gs://`` values): its
    sandbox is planned with the host's directories they name."""
    root = tmp_path / "jobs" / "gcs"
    spec = _spec(root / "b" / "p")
    planned: list[WorkerSpec] = []

    def plan(made: WorkerSpec, *_: object) -> None:
        planned.append(made)

    launch = standby.launcher(sys.executable, tmp_path / "state", set(), plan, str(root))
    pid, *_ = launch(["true"], managed_env(spec, gcs_root=str(root)), "j1", "n0", ())
    os.waitpid(pid, 0)
    assert [(s.checkpoint_dir, s.model_dir, s.tensorboard_dir) for s in planned] == [
        (spec.checkpoint_dir, spec.model_dir, spec.tensorboard_dir)]
