"""The CustomJob view of a job a user submitted with plain sbatch (adopted by mtc): listed and
got under the parent of the cluster it runs on, labelled with its origin, absent elsewhere."""

from __future__ import annotations

from shared.domain.events import JobAdopted
from tests.serving import PARENT
from tests.unit.api.conftest import Api


def test_an_adopted_job_is_listed_and_got_under_its_clusters_parent(api: Api) -> None:
    api.cluster("c1")
    with api.app.transaction() as uow:
        node_id = next(n.node_id for n in uow.nodes.list("c1") if n.role.value == "worker")
    api.app.inject(JobAdopted(job_id="slurm-7", attempt=1, node_ids=(node_id,), slurm_job_id=7,
                              name="train", user="alice", partition="mtc",
                              command="/home/alice/job.sh"), "//test")
    api.app.pump()
    listed = api.call("GET", f"/v1beta1/{PARENT}/customJobs").json
    (job,) = [j for j in listed["customJobs"] if j["name"].endswith("/customJobs/slurm-7")]
    assert job["labels"] == {"mtc-origin": "slurm", "mtc-slurm-job-id": "7", "mtc-slurm-user": "alice"}
    assert job["state"] == "JOB_STATE_RUNNING" and job["displayName"] == "train"
    assert job["mtcProgress"]["nodes"] == [node_id] and job["mtcProgress"]["attempt"] == 1
    got = api.call("GET", f"/v1beta1/{PARENT}/customJobs/slurm-7")
    assert got.status_code == 200 and got.json == job
    other = api.call("GET", "/v1beta1/projects/other/locations/l/customJobs/slurm-7")
    assert other.status_code in (403, 404)  # not in another project
    filtered = api.call("GET", f"/v1beta1/{PARENT}/customJobs",
                        query_string={"filter": 'labels.mtc-origin="slurm"'}).json
    assert [j["name"] for j in filtered.get("customJobs", [])] == [job["name"]]
