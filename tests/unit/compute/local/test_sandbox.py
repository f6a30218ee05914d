"""Jobs never run as root. A job started by a root server ran as root, with the
state directory, the API tokens and every other tenant's files in reach. Now a rank runs as
an unprivileged uid in a mount namespace that hides them, while its own checkpoint, output
and log paths work, also at ``/gcs/`` as Vertex's containers see Cloud Storage.

Real processes, real mounts: the two job tests run only as root (the case they are about) on
Linux; the plan's rules are checked everywhere."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest
from local_compute_support import run_to_exit

from shared.adapters.clock import SystemClock
from shared.adapters.compute.local import sandbox
from shared.adapters.compute.local.compute import LocalCompute
from tests.harness import Recorder, one_pool_gang

ROOT_ONLY = pytest.mark.skipif(not sys.platform.startswith("linux") or os.geteuid() != 0,
                               reason="the sandbox is for a root server on Linux")

# The job pries (each attempt's outcome is recorded), then uses its own paths.
PRY = textwrap.dedent(
    """
    import json, os, sys
    state, other = sys.argv[1], sys.argv[2]
    def attempt(what, fn):
        try:
            fn()
            return "read"
        except OSError as exc:
            return type(exc).__name__
    out = {
        "uid": os.getuid(),
        "tokens": attempt("tokens", lambda: open(os.path.join(state, "api-tokens.json")).read()),
        "state_db": attempt("db", lambda: open(os.path.join(state, "mtc.db"), "rb").read()),
        "other_job": attempt("other", lambda: open(os.path.join(other, "secret.txt")).read()),
        "other_list": attempt("other", lambda: os.listdir(other)),
        "root": attempt("root", lambda: os.listdir("/root")),
        "root_file": attempt("root", lambda: open("/root/.bashrc").read()),
    }
    out["told"] = [os.environ[n] for n in ("AIP_CHECKPOINT_DIR", "AIP_MODEL_DIR")]
    ckpt, model = (d.replace("gs://", "/gcs/", 1) for d in out["told"])  # as on Vertex
    with open(os.path.join(ckpt, "step-1.txt"), "w") as f:
        f.write("1")
    with open(os.path.join(model, "weights.txt"), "w") as f:
        f.write("w")
    out["gcs_model"] = open("/gcs/bkt/run1/model/weights.txt").read()
    out["gcs_ckpt"] = sorted(os.listdir("/gcs/bkt/run1/checkpoints"))
    with open(os.environ["MTC_TERMINATION_LOG"], "w") as f:
        f.write("a message")
    logs = os.environ["AIP_TENSORBOARD_LOG_DIR"].replace("gs://", "/gcs/", 1)
    with open(os.path.join(logs, "pry.json.tmp"), "w") as f:  # whole once it exists
        json.dump(out, f)
    os.replace(os.path.join(logs, "pry.json.tmp"), os.path.join(logs, "pry.json"))
    """
)



@ROOT_ONLY
@pytest.mark.slow  # real worker subprocesses
def test_a_job_of_a_root_server_cannot_read_the_tokens_other_jobs_or_root(tmp_path: Path
                                                                          ) -> None:
    state = tmp_path / "srv"
    state.mkdir(mode=0o700)
    (state / "api-tokens.json").write_text('{"secret": "t0ken"}')
    (state / "mtc.db").write_text("rows")
    other = state / "jobs" / "other" / "model"
    other.mkdir(parents=True)
    (other / "secret.txt").write_text("theirs")
    other.chmod(0o755)
    (other / "secret.txt").chmod(0o644)  # readable by anyone who can reach it
    compute = LocalCompute(state / "compute", Recorder(), SystemClock(), heartbeats=False,
                           sandboxed=True, output_root=state / "jobs", private_dirs=[state])
    out = state / "jobs" / "gcs" / "bkt" / "run1"
    try:
        compute.start_workers(one_pool_gang(
            "j1", 1, ("n0",), (sys.executable, "-c", PRY, str(state), str(other)), out=out))
        code = run_to_exit(compute, "j1", 60.0)
        log = compute.workers("j1")[0].log_path
        assert code == 0, Path(log).read_text()
    finally:
        compute.kill_all()
        compute.close()
    pried = json.loads((out / "logs" / "pry.json").read_text())
    assert pried["uid"] >= sandbox.FIRST_UID  # not root: a uid of the job's own
    for what in ("tokens", "state_db", "other_job", "other_list", "root", "root_file"):
        assert pried[what] != "read", f"the job could read {what}"
    assert (out / "checkpoints" / "step-1.txt").read_text() == "1"  # its own paths work
    assert (out / "model" / "weights.txt").stat().st_uid == pried["uid"]
    assert pried["gcs_model"] == "w"  # and are at /gcs/ too
    assert pried["gcs_ckpt"] == ["step-1.txt"]
    assert pried["told"] == ["gs://bkt/run1/checkpoints/", "gs://bkt/run1/model/"]  # Vertex's
    exit_file = Path(compute.state_dir / "run" / "j1" / "attempt-1-rank-0.exit")
    assert Path(f"{exit_file}.msg").read_text() == "a message"  # its termination log works
    assert not Path("/gcs/bkt").exists()  # the host's /gcs stays empty: a namespace's mounts


def test_jobs_get_uids_of_their_own(tmp_path: Path) -> None:
    """Two jobs never share a uid (they could read each other's /proc/<pid>/environ), and a
    job keeps its uid across attempts (its files stay its own)."""
    import sqlite3

    db = sqlite3.connect(":memory:")
    db.executescript(sandbox.SCHEMA)
    host = tmp_path / "uids.sqlite"
    a, b = sandbox.allocate_uid(db, "a", host), sandbox.allocate_uid(db, "b", host)
    assert a != b and min(a, b) >= sandbox.FIRST_UID
    assert sandbox.allocate_uid(db, "a", host) == a


def test_defect_7_two_deployments_first_jobs_get_different_uids(tmp_path: Path) -> None:
    """Every ledger started at the same uid, so two deployments' first jobs shared one and
    could signal each other and read each other's ``/proc/<pid>/environ``: uids come from
    the host's registry, which every deployment shares."""
    import sqlite3

    host = tmp_path / "var" / "uids.sqlite"
    first, second = sqlite3.connect(":memory:"), sqlite3.connect(":memory:")
    for db in (first, second):
        db.executescript(sandbox.SCHEMA)
    a, b = sandbox.allocate_uid(first, "t1", host), sandbox.allocate_uid(second, "t1", host)
    assert a != b
    assert stat_mode(host) == 0o600
    # a deployment whose ledger predates the registry keeps its uids apart from new ones
    old = sqlite3.connect(":memory:")
    old.executescript(sandbox.SCHEMA)
    old.execute("INSERT INTO sandbox_uids VALUES ('old', ?)", (sandbox.FIRST_UID + 100,))
    assert sandbox.allocate_uid(old, "new", host) == sandbox.FIRST_UID + 101
    assert sandbox.allocate_uid(first, "t2", host) == sandbox.FIRST_UID + 102


def stat_mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_a_symlink_a_job_planted_never_gets_root_to_chown_its_target(tmp_path: Path) -> None:
    """A job owns its checkpoint directory: a link it leaves there, named as its metric
    file's directory, must not lead root to bind or chown what it points at."""
    from shared.adapters.compute.local.sandbox import _chown_tree, metric_dir
    from shared.ports import WorkerSpec

    job, target = tmp_path / "jobs" / "t1", tmp_path / "etc"
    (job / "checkpoints").mkdir(parents=True)
    target.mkdir()
    (job / "checkpoints" / "evil").symlink_to(target)
    spec = WorkerSpec("t1", 1, 0, 1, "n0", ("python",), (), str(job / "checkpoints"),
                      str(job / "model"), str(job / "tb"))
    assert metric_dir(spec, {"CLOUD_ML_HP_METRIC_FILE":
                             str(job / "checkpoints" / "evil" / "m.json")}) == []
    with pytest.raises(PermissionError, match="symbolic link"):
        _chown_tree(str(job / "checkpoints" / "evil"), 12345, 12345)
    assert target.stat().st_uid == os.getuid()


def test_root_is_never_a_configured_worker_user() -> None:
    with pytest.raises(ValueError, match="root"):
        sandbox.user_ids("root")


PRY_TOKENS = textwrap.dedent(
    """
    import os, sys
    try:
        open(sys.argv[1]).read()
        seen = "read"
    except OSError as exc:
        seen = type(exc).__name__
    with open(os.path.join(os.environ["AIP_MODEL_DIR"].replace("gs://", "/gcs/", 1),
                           "tokens.txt"), "w") as f:
        f.write(seen)
    """
)


@ROOT_ONLY
@pytest.mark.slow  # real worker subprocesses
def test_a_job_submitted_to_a_root_server_cannot_read_the_token_file(tmp_path: Path) -> None:
    """The same through the API and the embedded wiring (``mtc serve``'s): the
    state directory and the output root are what the sandbox hides."""
    from services.api.http import create_app
    from services.api.tokens import LocalTokens
    from services.wiring.api import embedded_api
    from services.wiring.embedded import embedded
    from tests.harness import job_body
    from tests.serving import PARENT, cluster_body
    from tests.unit.api.conftest import AUTH, TOKEN, one_pass_config

    state = tmp_path / "state"
    app = embedded(state, config=one_pass_config(), compute_options={"sandboxed": True})
    LocalTokens(state / "api-tokens.json").create("tenant", "editor", "p")  # `mtc token create`
    ctx, _ = embedded_api(app, env_token=TOKEN)
    client = create_app(ctx).test_client()
    base = f"/v1beta1/{PARENT}"
    tokens = state / "api-tokens.json"
    try:
        made = client.post(f"{base}/modelDevelopmentClusters?modelDevelopmentClusterId=c1",
                           json=cluster_body(workers=1), headers=AUTH)
        assert made.status_code == 200, made.json
        assert tokens.exists()  # the server's tokens, in the state directory
        body = job_body(replicas=1)
        body["jobSpec"]["persistentResourceId"] = "c1"
        body["jobSpec"]["baseOutputDirectory"] = {"outputUriPrefix": "gs://bkt/pry"}
        pool = body["jobSpec"]["workerPoolSpecs"][0]
        pool["containerSpec"]["command"] = [sys.executable, "-c", PRY_TOKENS, str(tokens)]
        made = client.post(f"{base}/customJobs?customJobId=pry", json=body, headers=AUTH)
        assert made.status_code == 200, made.json
        seen = state / "jobs" / "gcs" / "bkt" / "pry" / "model" / "tokens.txt"
        assert app.run(lambda: seen.exists(), timeout_s=60), "the job did not run"
        assert seen.read_text() != "read", "the job read api-tokens.json"
    finally:
        app.compute.kill_all()
        app.close()


def test_a_command_or_env_naming_the_state_directory_does_not_get_it_bound(tmp_path: Path
                                                                           ) -> None:
    """The command and the env are the tenant's: naming a hidden path must not bind it."""
    state, out = tmp_path / "state", tmp_path / "state" / "jobs"
    (out / "j" / "checkpoints").mkdir(parents=True)
    (state / "api-tokens.json").write_text("{}")
    made = sandbox.plan(
        uid=sandbox.FIRST_UID, gid=sandbox.FIRST_UID, hidden=[str(state)],
        job_dirs=[str(out / "j" / "checkpoints")], job_files=[], read_only=[],
        home=str(state / "home"), env={"PYTHONPATH": str(state)},
        command=["python", str(state / "api-tokens.json"), "--cache", str(state)],
        python=sys.executable, output_root=str(out))
    bound = {b.src for b in made.binds}
    assert str(state) not in bound and str(state / "api-tokens.json") not in bound
    assert any(str(state).startswith(c) for c in made.covers)  # hidden (itself or above)
    assert str(out / "j" / "checkpoints") in bound


def test_a_trials_metric_file_is_writable_only_inside_its_jobs_directory(tmp_path: Path) -> None:
    """The tuning service puts CLOUD_ML_HP_METRIC_FILE in the trial's output directory, which
    the sandbox keeps read-only: its directory is bound for the job, and only there (a job
    naming another path gets nothing bound; hypertune failed with EROFS before)."""
    from shared.adapters.compute.local.sandbox import metric_dir
    from shared.ports import WorkerSpec

    job = tmp_path / "jobs" / "t1"
    spec = WorkerSpec("t1", 1, 0, 1, "n0", ("python",), (), str(job / "checkpoints"),
                      str(job / "model"), str(job / "tb"))
    own = {"CLOUD_ML_HP_METRIC_FILE": str(job / "hypertune" / "output.metric")}
    assert metric_dir(spec, own) == [str(job / "hypertune")]
    for elsewhere in (str(tmp_path / "state" / "x.metric"), str(job / "x.metric"),
                      str(job / ".." / "t2" / "hypertune" / "m"), "relative/m"):
        assert metric_dir(spec, {"CLOUD_ML_HP_METRIC_FILE": elsewhere}) == [], elsewhere
