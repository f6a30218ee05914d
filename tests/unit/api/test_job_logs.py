"""GET .../customJobs/{id}/logs (mtc extension): a real 2-rank job's output, paged by byte
offset; bad rank/attempt/pageToken are 400s naming the field, an unknown job a 404."""

from __future__ import annotations

import sys
import time
from typing import Any

from services.api.job_logs import _encode, replica_of
from shared.adapters.compute.worker_logs import read_lines
from tests.serving import PARENT, vertex_pools
from tests.unit.api.conftest import Api

JOBS = f"/v1/{PARENT}/customJobs"
PROGRAM = ("import os\nr = os.environ['RANK']\nfor i in range(2500):\n"
           "    print(f'rank {r} line {i}')\nprint('no newline at the end', end='')\n")


def job(replicas: int = 2) -> dict[str, Any]:
    return {"displayName": "echo", "jobSpec": {"persistentResourceId": "c1",
                                               "workerPoolSpecs": vertex_pools({
        "machineSpec": {"machineType": "a3-highgpu-8g", "acceleratorType": "NVIDIA_H100_80GB",
                        "acceleratorCount": 8},
        "containerSpec": {"imageUri": "local", "command": [sys.executable, "-c", PROGRAM]}},
        replicas)}}


def finished(api: Api, job_id: str) -> None:
    deadline = time.monotonic() + 30
    while api.call("GET", f"{JOBS}/{job_id}").json["state"] != "JOB_STATE_SUCCEEDED":
        assert time.monotonic() < deadline
        api.app.pump(budget_s=0.3)
        time.sleep(0.05)


def read_all(api: Api, job_id: str, query: str = "") -> tuple[list[str], int]:
    lines: list[str] = []
    token, pages = "", 0
    while True:
        sep = "&" if query else ""
        resp = api.call("GET", f"{JOBS}/{job_id}/logs?{query}{sep}pageSize=1000"
                        + (f"&pageToken={token}" if token else ""))
        assert resp.status_code == 200, resp.json
        lines += resp.json.get("lines", [])
        pages += 1
        token = resp.json.get("nextPageToken", "")
        if not token:
            return lines, pages


def test_logs_are_paged_by_byte_offset_per_rank(api: Api) -> None:
    api.cluster(workers=2)
    assert api.call("POST", f"{JOBS}?customJobId=e1", job()).status_code == 200
    finished(api, "e1")
    for rank in (0, 1):
        lines, pages = read_all(api, "e1", f"rank={rank}")
        assert lines == [f"rank {rank} line {i}" for i in range(2500)] + [
            "no newline at the end"]
        assert pages == 3  # 1000 + 1000 + 501 lines: the token carried the byte offset
    first = api.call("GET", f"{JOBS}/e1/logs").json
    assert first["attempt"] == first["latestAttempt"] == 1 and first["rank"] == 0
    assert len(first["lines"]) == 1000 and first["nextPageToken"]
    # a token names its attempt and rank: asking for another with it is refused
    other = api.call("GET", f"{JOBS}/e1/logs?rank=1&pageToken={first['nextPageToken']}")
    assert other.status_code == 400 and _field(other) == "pageToken"


def test_bad_rank_attempt_and_token_are_400s_and_an_unknown_job_404(api: Api) -> None:
    api.cluster(workers=2)
    assert api.call("POST", f"{JOBS}?customJobId=e2", job(replicas=1)).status_code == 200
    finished(api, "e2")
    for query, field in (("rank=1", "rank"), ("rank=-1", "rank"), ("rank=x", "rank"),
                         ("attempt=2", "attempt"), ("attempt=0", "attempt"),
                         ("attempt=1.5", "attempt"), ("pageSize=-3", "pageSize"),
                         ("pageToken=garbage", "pageToken"),
                         (f"pageToken={_encode(1, 0, 10**9)}", "pageToken")):
        resp = api.call("GET", f"{JOBS}/e2/logs?{query}")
        assert resp.status_code == 400, (query, resp.json)
        assert _field(resp) == field, (query, resp.json)
    assert api.call("GET", f"{JOBS}/nope/logs").status_code == 404
    assert api.call("GET", "/v1/projects/other/locations/l/customJobs/e2/logs").status_code \
        == 404
    assert api.call("GET", f"{JOBS}/e2/logs", headers={}).status_code == 401


def test_a_page_holds_whole_lines_until_the_writer_ends(tmp_path: Any) -> None:
    log = tmp_path / "a.log"
    log.write_bytes(b"one\ntwo\nthr")
    page = read_lines(str(log), 0, max_lines=10, ended=False)
    assert page.lines == ["one", "two"] and page.offset == 8
    with log.open("ab") as f:
        f.write(b"ee\nfour")
    page = read_lines(str(log), page.offset, max_lines=10, ended=False)
    assert page.lines == ["three"]
    page = read_lines(str(log), page.offset, max_lines=10, ended=True)
    assert page.lines == ["four"] and page.at_end
    assert read_lines(str(tmp_path / "none.log"), 0, max_lines=5, ended=False).lines == []
    log.write_bytes(b"x" * 70_000 + b"\n")
    assert [len(x) for x in read_lines(str(log), 0, max_lines=10, ended=True).lines] == [
        32768, 32768, 4464]


def _field(resp: Any) -> str:
    details = resp.json["error"].get("details") or [{}]
    return str(details[0].get("fieldViolations", [{}])[0].get("field"))


def test_a_program_rank_reads_the_log_of_the_replica_that_runs_it() -> None:
    """``--rank`` is the RANK a program sees: one process per replica (Vertex's world) it is
    the replica; with MTC_PROCESSES_PER_NODE a replica's processes share its log, counted
    pool by pool (pool 0: 2 replicas x 4 processes, pool 1: 1 x 2)."""
    assert [replica_of(r, [(3, 1)]) for r in (0, 1, 2)] == [0, 1, 2]
    layout = [(2, 4), (1, 2)]
    assert [replica_of(r, layout) for r in range(10)] == [0, 0, 0, 0, 1, 1, 1, 1, 2, 2]
    assert replica_of(10, layout) == 10  # past the last rank: as given, for the error
    assert replica_of(None, layout) is None
