"""Issue: output paths. `gs://my-bucket/run1` was written to a relative `gs:/` directory in
the server's working directory, and absolute host paths and `..` were honoured. Outputs stay
inside the configured root; anything else is a 400."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from services.job_submission.scheduling import local_output_dir
from tests.serving import PARENT
from tests.unit.api.conftest import Api
from tests.unit.api.test_vertex_surface import job_body, violation

JOBS = f"/v1/{PARENT}/customJobs"


def test_output_paths_stay_inside_the_configured_root(api: Api, tmp_path: Path) -> None:
    root = tmp_path / "jobs"
    assert local_output_dir("gs://my-bucket/run1", root, "j") == str(root / "gcs/my-bucket/run1")
    assert local_output_dir("gs://b/../../etc", root, "j").startswith(str(root))
    assert local_output_dir(None, root, "j") == str(root / "j")

    api.cluster()
    for bad in ("/etc", "../up", "file:///etc", "gs://b/x/../../y", "gs://", "s3://b/x"):
        body = job_body()
        body["jobSpec"]["baseOutputDirectory"] = {"outputUriPrefix": bad}
        assert violation(api.call("POST", JOBS, body)) == \
            "jobSpec.baseOutputDirectory.outputUriPrefix", bad

    body = job_body()
    body["jobSpec"]["baseOutputDirectory"] = {"outputUriPrefix": "gs://my-bucket/run1"}
    body["jobSpec"]["workerPoolSpecs"][0]["containerSpec"]["command"] = [
        sys.executable, "-c",
        # gs:// as on Vertex where the job's sandbox has /gcs/, else a local path
        "import os, pathlib; p = pathlib.Path(os.environ['AIP_MODEL_DIR'].replace('gs://', '/gcs/')); "
        "p.mkdir(parents=True, exist_ok=True); (p / 'model.txt').write_text('ok')"]
    assert api.call("POST", f"{JOBS}?customJobId=out1", body).status_code == 200
    deadline = time.monotonic() + 30
    while api.call("GET", f"{JOBS}/out1").json["state"] != "JOB_STATE_SUCCEEDED":
        assert time.monotonic() < deadline
        api.app.pump(budget_s=0.2)
    written = api.app.deps.config.output_root / "gcs" / "my-bucket" / "run1" / "model"
    assert (written / "model.txt").read_text() == "ok"
    assert not (Path.cwd() / "gs:").exists()
