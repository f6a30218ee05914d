"""A ``gs://`` bucket belongs to one project: the first project to name it (a job's output or
packages, a model's artifacts, a pipeline, a tuning job) owns it, and another project's
create that names it is refused with 403 naming the URI, changing nothing
(``services.api.buckets``). Every project's jobs share one ``<output root>/gcs`` tree, so
without this a project B job read project A's model weights by naming them."""

from __future__ import annotations

import copy
import json
import os
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from services.api.buckets import BUCKETS
from tests.unit.api.conftest import Api
from tests.unit.api.test_project_ids import _create_cluster, _job
from tests.unit.api.test_registry_api import CUSTOM_TASK
from tests.unit.api.test_tuning_api import body as tuning_body

A, B = "projects/pa/locations/l", "projects/pb/locations/l"
PACKAGE_IMAGE = "us-docker.pkg.dev/vertex-ai/training/pytorch-cpu.2-4.py310:latest"


def _job_in(cluster_id: str, output: str | None = None, package: str | None = None
            ) -> dict[str, Any]:
    job = _job(cluster_id)
    if output is not None:
        job["jobSpec"]["baseOutputDirectory"] = {"outputUriPrefix": output}
    if package is not None:
        pool = job["jobSpec"]["workerPoolSpecs"][0]
        del pool["containerSpec"]
        pool["pythonPackageSpec"] = {"executorImageUri": PACKAGE_IMAGE,
                                     "pythonModule": "trainer.task", "packageUris": [package]}
    return job


def _refused(resp: Any, uri: str, field: str) -> None:
    assert resp.status_code == 403, resp.json
    error = resp.json["error"]
    assert error["status"] == "PERMISSION_DENIED"
    assert uri in error["message"] and field in error["message"], error
    assert error["details"][0]["fieldViolations"][0]["field"] == field
    assert "projects/pa" not in json.dumps(resp.json)  # A's project is not named to B


def test_defect_4_another_projects_bucket_is_refused_at_create(api: Api) -> None:
    for parent in (A, B):
        api.done(_create_cluster(api, parent, "c1", workers=1).json)
    made = api.call("POST", f"/v1/{A}/customJobs", _job_in("c1", "gs://a-bucket/run1"))
    assert made.status_code == 200, made.json  # A is the first: a-bucket is A's

    cases = [  # (what B creates, the URI named, its field)
        ("customJobs", _job_in("c1", "gs://a-bucket/mine"), "gs://a-bucket/mine",
         "jobSpec.baseOutputDirectory.outputUriPrefix"),
        ("customJobs", _job_in("c1", "gs://b-bucket/out", package="gs://./a-bucket/w.tar.gz"),
         "gs://./a-bucket/w.tar.gz", "jobSpec.workerPoolSpecs[0].pythonPackageSpec.packageUris[0]"),
        ("models:upload", {"model": {"displayName": "m", "artifactUri": "gs://a-bucket/run1/model"}},
         "gs://a-bucket/run1/model", "model.artifactUri"),
        ("trainingPipelines", {
            "displayName": "p", "trainingTaskDefinition": CUSTOM_TASK,
            "trainingTaskInputs": _job_in("c1", "gs://a-bucket/p")["jobSpec"],
            "modelToUpload": {"displayName": "pm"}},
         "gs://a-bucket/p", "trainingTaskInputs.baseOutputDirectory.outputUriPrefix"),
        ("trainingPipelines", {
            "displayName": "p", "trainingTaskDefinition": CUSTOM_TASK,
            "trainingTaskInputs": _job_in("c1", "gs://b-bucket/p")["jobSpec"],
            "modelToUpload": {"displayName": "pm", "artifactUri": "gs://a-bucket/m"}},
         "gs://a-bucket/m", "modelToUpload.artifactUri"),
    ]
    tuning = tuning_body()
    tuning["trialJobSpec"]["baseOutputDirectory"] = {"outputUriPrefix": "gs://a-bucket/hp"}
    cases.append(("hyperparameterTuningJobs", tuning, "gs://a-bucket/hp",
                  "trialJobSpec.baseOutputDirectory.outputUriPrefix"))
    for collection, body, uri, field in cases:
        _refused(api.call("POST", f"/v1/{B}/{collection}", copy.deepcopy(body)), uri, field)
    for collection in ("customJobs", "models", "trainingPipelines", "hyperparameterTuningJobs"):
        listed = api.call("GET", f"/v1/{B}/{collection}").json  # nothing was made
        assert not any(listed.values()), (collection, listed)
    with api.app.transaction() as uow:  # and nothing claimed: B's own bucket is still free
        assert uow.record(BUCKETS, "b-bucket") is None
        assert uow.record(BUCKETS, "a-bucket")["project"] == "pa"

    mine = api.call("POST", f"/v1/{B}/customJobs", _job_in("c1", "gs://b-bucket/run1"))
    assert mine.status_code == 200, mine.json  # B uses its own bucket
    for parent, path, body in (
            (A, "customJobs", _job_in("c1", "gs://a-bucket/run2")),  # A reuses its own
            (A, "models:upload", {"model": {"displayName": "m",
                                            "artifactUri": "gs://a-bucket/run1/model"}}),
            (B, "customJobs", _job_in("c1", "gs://b-bucket/run2"))):
        resp = api.call("POST", f"/v1/{parent}/{path}", body)
        assert resp.status_code == 200, resp.json
    _refused(api.call("POST", f"/v1/{A}/customJobs", _job_in("c1", "gs://b-bucket/x")),
             "gs://b-bucket/x", "jobSpec.baseOutputDirectory.outputUriPrefix")  # both ways


def test_buckets_named_before_ownership_was_recorded_stay_with_their_first_project(api: Api
                                                                                   ) -> None:
    """A state directory that already holds records: the oldest use of each bucket decides
    (a job's output, a model version's artifacts), so no project takes another's bucket by
    naming it first after the upgrade."""
    with api.app.transaction() as uow:
        uow.put_record("api_resources", "customJob:old", {
            "kind": "customJob", "id": "old", "parent": A, "project": "pa", "location": "l",
            "created": 1.0, "time": 1.0, "resource": {"jobSpec": {
                "baseOutputDirectory": {"outputUriPrefix": "gs://old-bucket/run"}}}})
        uow.put_record("registry_model_versions", "m@1", {
            "model_id": "m", "parent": B, "version_id": "1", "created": 2.0, "time": 2.0,
            "model": {"displayName": "m", "artifactUri": "gs://old-models/m"}})
    api.done(_create_cluster(api, B, "c1", workers=1).json)  # (a cluster names no bucket)
    for parent, path, body, uri, field in (
            (B, "customJobs", _job_in("c1", "gs://old-bucket/x"), "gs://old-bucket/x",
             "jobSpec.baseOutputDirectory.outputUriPrefix"),
            (A, "models:upload", {"model": {"displayName": "m", "artifactUri": "gs://old-models/n"}},
             "gs://old-models/n", "model.artifactUri")):
        resp = api.call("POST", f"/v1/{parent}/{path}", body)
        assert resp.status_code == 403 and uri in resp.json["error"]["message"], resp.json
        assert field == resp.json["error"]["details"][0]["fieldViolations"][0]["field"]
    for parent, uri in ((A, "gs://old-bucket/m"), (B, "gs://old-models/m2")):
        resp = api.call("POST", f"/v1/{parent}/models:upload",
                        {"model": {"displayName": "m", "artifactUri": uri}})
        assert resp.status_code == 200, resp.json


# A B job reads the files its command names after --package and reports what it could read.
PRY = textwrap.dedent(
    """
    import json, os, sys
    seen = {}
    for path in sys.argv[1:]:
        if path == "--package":
            continue
        try:
            seen[path] = open(path).read()
        except OSError as exc:
            seen[path] = type(exc).__name__
    out = os.path.join(os.environ["AIP_MODEL_DIR"].replace("gs://", "/gcs/"), "seen.json")
    with open(out + ".tmp", "w") as f:  # whole or not at all: the test reads it once it exists
        json.dump(seen, f)
    os.replace(out + ".tmp", out)
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux") or os.geteuid() != 0,
                    reason="the sandbox is for a root server on Linux")
@pytest.mark.slow  # a real worker in a real sandbox
def test_a_project_b_job_under_a_root_server_cannot_read_project_as_weights(tmp_path: Path
                                                                             ) -> None:
    """The defect as reported, through the API and ``mtc serve``'s embedded wiring: a B job
    naming A's weights after ``--package`` does not get them; its own bucket's file it does."""
    from services.api.http import create_app
    from services.wiring.api import embedded_api
    from services.wiring.embedded import embedded
    from tests.unit.api.conftest import TOKEN, one_pass_config

    state = tmp_path / "state"
    app = embedded(state, config=one_pass_config(), compute_options={"sandboxed": True})
    ctx, _ = embedded_api(app, env_token=TOKEN)
    api = Api(create_app(ctx).test_client(), app)
    gcs = state / "jobs" / "gcs"
    theirs, own = gcs / "a-bucket" / "run1" / "model" / "weights.txt", gcs / "b-bucket" / "w.txt"
    try:
        made = api.call("POST", f"/v1/{A}/models:upload", {"model": {
            "displayName": "m", "artifactUri": "gs://a-bucket/run1/model"}})
        assert made.status_code == 200, made.json  # a-bucket is A's
        for path, text in ((theirs, "A's weights"), (own, "B's own")):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            path.chmod(0o644)  # readable by anyone who can reach it
        api.done(_create_cluster(api, B, "c1", workers=1).json)
        job = _job_in("c1", "gs://b-bucket/pry")
        job["jobSpec"]["workerPoolSpecs"][0]["containerSpec"]["command"] = [
            sys.executable, "-c", PRY, "--package", str(theirs), "--package", str(own)]
        made = api.call("POST", f"/v1/{B}/customJobs", job)
        assert made.status_code == 200, made.json
        seen_file = gcs / "b-bucket" / "pry" / "model" / "seen.json"
        assert app.run(lambda: seen_file.exists(), timeout_s=60), "the job did not run"
        seen = json.loads(seen_file.read_text())
        assert seen[str(own)] == "B's own"
        assert seen[str(theirs)] != "A's weights", "a project B job read project A's weights"
    finally:
        app.compute.kill_all()
        app.close()
