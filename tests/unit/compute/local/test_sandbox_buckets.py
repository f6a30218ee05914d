"""A job reads only its own project's buckets: the sandbox binds a ``--package`` file (from any
position of the command) only from a bucket the job's spec names (``WorkerSpec.buckets``,
each admitted as its project's at create: ``services.api.buckets``), and at its real path
(a symlink in the job's own bucket reaches nothing outside it). A project B job printed
project A's model weights by naming them after ``--package``."""

from __future__ import annotations

import sys
from pathlib import Path

from shared.adapters.compute.local import sandbox
from shared.adapters.compute.remote import codec
from shared.domain.specs import CustomJobSpec
from shared.ports import Gang, LaunchGroup


def _tree(tmp_path: Path) -> tuple[Path, Path, Path, Path]:
    """The output root with A's weights, B's package and B's job's output directory."""
    out = tmp_path / "state" / "jobs"
    gcs = out / "gcs"
    weights = gcs / "a-bucket" / "run1" / "model" / "weights.bin"
    package = gcs / "b-bucket" / "pkgs" / "trainer-0.1.tar.gz"
    run = gcs / "b-bucket" / "run1"
    for f in (weights, package):
        f.parent.mkdir(parents=True)
        f.write_text("x")
    for d in ("checkpoints", "model", "logs"):
        (run / d).mkdir(parents=True)
    return out, weights, package, run


def test_defect_4_a_job_cannot_read_another_projects_bucket_via_package(tmp_path: Path) -> None:
    out, weights, package, run = _tree(tmp_path)
    link = run / "model" / "planted"  # B's job can write its own bucket: a symlink to A's
    link.symlink_to(weights)
    gcs = str(out / "gcs")
    command = ["python", "pyenv.py", "--package", str(weights), "--package", str(package),
               "--package", str(link), "--", "python", "-m", "t", "--package", str(weights)]
    ro, _ = sandbox.command_paths(command, [str(out)], None, gcs, ("b-bucket",))
    assert ro == [str(package)]  # its own package only: not A's, from any position, nor the link
    assert sandbox.command_paths(command, [str(out)], None, gcs, ())[0] == []  # no buckets: none
    assert sandbox.command_paths(command, [str(out)], None, gcs, ("a-bucket", "b-bucket"))[0] == [
        str(weights), str(package), str(weights), str(weights)]  # (A's own job would get them)

    made = sandbox.plan(
        uid=sandbox.FIRST_UID, gid=sandbox.FIRST_UID, hidden=[str(tmp_path / "state")],
        job_dirs=[str(run / d) for d in ("checkpoints", "model", "logs")], job_files=[],
        read_only=[], home=str(tmp_path / "home"), env={}, command=command,
        python=sys.executable, output_root=str(out), buckets=("b-bucket",))
    a_bucket = str(out / "gcs" / "a-bucket")
    assert not [b for b in made.binds if b.src.startswith(a_bucket)], made.binds
    assert not [b for b in made.binds if b.dst.startswith(sandbox.GCS_MOUNT + "/a-bucket")]
    binds = {(b.src, b.dst, b.write) for b in made.binds}
    for d in ("checkpoints", "model", "logs"):  # its own output: read-write, also at /gcs
        assert (str(run / d), str(run / d), True) in binds
        assert (str(run / d), f"{sandbox.GCS_MOUNT}/b-bucket/run1/{d}", True) in binds
    assert (str(package), f"{sandbox.GCS_MOUNT}/b-bucket/pkgs/trainer-0.1.tar.gz", False) in binds
    assert any(str(out).startswith(c) for c in made.covers)  # the rest of the tree: hidden
    assert sandbox.GCS_MOUNT in made.covers


def test_a_gang_carries_the_buckets_its_spec_names_to_every_rank(tmp_path: Path) -> None:
    """The buckets reach the compute adapter with the gang (and across the remote executor's
    wire): its output's and its packages', nothing the command says."""
    from shared.service_layer.gangs import buckets

    spec = CustomJobSpec.parse({"displayName": "t", "jobSpec": {
        "baseOutputDirectory": {"outputUriPrefix": "gs://b-out/run1"},
        "workerPoolSpecs": [{
            "machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": 1,
            "pythonPackageSpec": {
                "executorImageUri": "us-docker.pkg.dev/vertex-ai/training/pytorch-cpu.2-4."
                                    "py310:latest", "pythonModule": "t",
                "packageUris": ["gs://b-pkgs/t.tar.gz", "gs:///b-out/u.tar.gz", "/local/x",
                                "file:///state/jobs/gcs/a-bucket/w"]}}]}})
    assert buckets(spec) == ("b-out", "b-pkgs")
    gang = Gang("j", 1, ("n0", "n1"), (LaunchGroup(0, 2, ("python",), ()),), "/c", "/m", "/t",
                buckets=("b-out", "b-pkgs"))
    assert {w.buckets for w in gang.workers()} == {("b-out", "b-pkgs")}
    again = codec.gang_of_args(codec.gang_args(gang))
    assert again == gang
    assert codec.gang_of_workers([codec.worker_to_dict(w) for w in gang.workers()]) == gang
    older = codec.gang_args(Gang("j", 1, ("n0",), (LaunchGroup(0, 1, ("x",), ()),), "c", "m",
                                 "t"))
    assert "buckets" not in older["gang"] and codec.gang_of_args(older).buckets == ()
