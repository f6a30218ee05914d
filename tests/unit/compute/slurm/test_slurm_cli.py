"""shared/adapters/compute/slurm/cli.py against outputs recorded from the real test cluster."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest

from shared.adapters.compute.slurm.cli import (
    SlurmCli,
    SlurmError,
    SlurmPermanentError,
    SlurmTransientError,
    classify,
    expand_hostlist,
    parse_jobs,
    parse_nodes,
    subprocess_runner,
)
from shared.domain.errors import PermanentError, TransientError
from tests.recorded import fixture_text

ERRORS: dict[str, Any] = json.loads(fixture_text("slurm/cli_errors.json"))


class Recorded:
    def __init__(self, returncode: int = 0, stdout: str = "", stderr: str = "") -> None:
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


class FakeSlurm:
    """Replays one answer per command; records argv, timeout and extra env."""

    def __init__(self, answer: Recorded | BaseException | None = None) -> None:
        self.answer = answer or Recorded()
        self.calls: list[tuple[list[str], float, Mapping[str, str] | None]] = []

    def __call__(self, argv: Sequence[str], timeout_s: float, env: Mapping[str, str] | None) -> Recorded:
        self.calls.append((list(argv), timeout_s, env))
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer


def cli(answer: Recorded | BaseException | None = None) -> tuple[SlurmCli, FakeSlurm]:
    fake = FakeSlurm(answer)
    return SlurmCli(runner=fake, timeout_s=9.0), fake


def test_nodes_from_recorded_sinfo_with_a_drained_node() -> None:
    client, fake = cli(Recorded(stdout=fixture_text("slurm/sinfo_drain.json")))
    nodes = {n.name: n for n in client.nodes()}
    assert fake.calls == [(["sinfo", "--json"], 9.0, None)]
    assert sorted(nodes) == ["c1", "c2", "n1", "n2", "n3", "n4"]
    n1 = nodes["n1"]
    assert (n1.state, n1.state_flags, n1.reason) == ("idle", ("DRAIN",), "mtc test")
    assert n1.drained and not n1.available
    assert nodes["n2"].state == "mixed" and nodes["n2"].available
    assert nodes["c1"].powered_down and nodes["c1"].state_flags == ("CLOUD", "POWERED_DOWN")
    assert nodes["c1"].partitions == ("cloud",)


def test_nodes_during_reboot_and_power_up() -> None:
    client, _ = cli(Recorded(stdout=fixture_text("slurm/sinfo_reboot_powerup.json")))
    nodes = {n.name: n for n in client.nodes()}
    assert nodes["n4"].state_flags == ("DRAIN", "REBOOT_REQUESTED")
    assert nodes["n4"].reason == "mtc reboot"
    assert nodes["n2"].reason == "XidError 79"
    assert "POWER_UP" in nodes["c2"].state_flags


def test_cloud_node_after_power_up() -> None:
    client, _ = cli(Recorded(stdout=fixture_text("slurm/sinfo_cloud_up.json")))
    c2 = client.node("c2")
    assert c2.state == "idle" and not c2.powered_down and c2.available
    with pytest.raises(SlurmPermanentError, match="Invalid node name"):
        client.node("zz9")


def test_jobs_from_recorded_squeue_after_a_requeue() -> None:
    client, fake = cli(Recorded(stdout=fixture_text("slurm/squeue_requeued.json")))
    jobs = {j.job_id: j for j in client.jobs()}
    assert fake.calls[0][0] == ["squeue", "--json"]
    assert {j: jobs[j].job_state for j in jobs} == {1: "CANCELLED", 2: "COMPLETED", 3: "RUNNING"}
    job = jobs[3]
    assert (job.name, job.nodes, job.node_list) == ("twonode", "n[2-3]", ("n2", "n3"))
    assert (job.restart_cnt, job.requeue, job.batch_host) == (1, True, "n2")
    assert client.job(3) == job


@pytest.mark.parametrize("name", ["sinfo_unreachable.json", "squeue_unreachable.json"])
def test_unreachable_controller_with_exit_0_is_transient(name: str) -> None:
    # Recorded: Slurm 22.05 exits 0 and reports the failure only inside the JSON.
    client, _ = cli(Recorded(stdout=fixture_text(f"slurm/{name}")))
    with pytest.raises(SlurmTransientError) as info:
        client.nodes() if name.startswith("sinfo") else client.jobs()
    assert isinstance(info.value, TransientError)


def test_newer_slurm_json_shape() -> None:
    nodes = parse_nodes({"nodes": [{"name": "g1", "state": ["IDLE", "DRAIN"], "reason": "x"}]})
    assert (nodes[0].state, nodes[0].state_flags) == ("idle", ("DRAIN",))
    jobs = parse_jobs(
        {
            "jobs": [
                {
                    "job_id": 42,
                    "name": "train",
                    "job_state": ["RUNNING"],
                    "nodes": "g[01-02]",
                    "restart_cnt": {"set": True, "infinite": False, "number": 2},
                    "requeue": True,
                },
                {"job_id": {"set": False}, "name": "ignored"},
                "garbage",
            ]
        }
    )
    assert [(j.job_id, j.job_state, j.restart_cnt, j.node_list) for j in jobs] == [
        (42, "RUNNING", 2, ("g01", "g02"))
    ]


@pytest.mark.parametrize(
    "stdout",
    ['{"nodes": "nope"}', "[]", "not json at all", '{"meta": {}, "errors": []}'],
)
def test_garbage_sinfo(stdout: str) -> None:
    client, _ = cli(Recorded(stdout=stdout))
    with pytest.raises((SlurmTransientError, SlurmPermanentError)):
        client.nodes()


def test_argv_of_every_action() -> None:
    client, fake = cli()
    client.drain("n2", "XidError 79 on 0000:3b:00")
    client.resume("n2")
    client.reboot("n3", "mtc reboot")
    client.power_down("c1")
    client.power_up("c1")
    client.requeue(17)
    client.signal_job(17)
    client.signal_job(17, "USR1", full=True)
    assert [argv for argv, _, _ in fake.calls] == [
        ["scontrol", "update", "nodename=n2", "state=drain", "reason=XidError 79 on 0000:3b:00"],
        ["scontrol", "update", "nodename=n2", "state=resume"],
        ["scontrol", "reboot", "ASAP", "nextstate=resume", "reason=mtc reboot", "n3"],
        ["scontrol", "update", "nodename=c1", "state=power_down"],
        ["scontrol", "update", "nodename=c1", "state=power_up"],
        ["scontrol", "requeue", "17"],
        ["scancel", "--signal=TERM", "17"],
        ["scancel", "--signal=USR1", "--full", "17"],
    ]
    assert {timeout for _, timeout, _ in fake.calls} == {9.0}


def test_submit() -> None:
    client, fake = cli(Recorded(stdout="23\n"))
    job_id = client.submit(
        "/jobs/train.sh",
        nodes=2,
        job_name="train",
        env={"MTC_JOB_ID": "j-1", "MTC_ARGS": "a,b=c"},
        output="/ckpt/out-%j.txt",
        partition="main",
    )
    assert job_id == 23
    argv, _, env = fake.calls[0]
    assert argv == [
        "sbatch",
        "--parsable",
        "--nodes=2",
        "--job-name=train",
        "--requeue",
        "--open-mode=append",
        "--export=ALL",
        "--output=/ckpt/out-%j.txt",
        "--partition=main",
        "/jobs/train.sh",
    ]
    assert env == {"MTC_JOB_ID": "j-1", "MTC_ARGS": "a,b=c"}
    cluster_client, _ = cli(Recorded(stdout="24;mtc\n"))
    assert cluster_client.submit("/x.sh", nodes=1, job_name="x", requeue=False) == 24
    weird, _ = cli(Recorded(stdout="Submitted batch job\n"))
    with pytest.raises(SlurmPermanentError, match="no job id"):
        weird.submit("/x.sh", nodes=1, job_name="x")


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("drain_invalid_node", SlurmPermanentError),
        ("resume_not_drained", SlurmPermanentError),
        ("requeue_invalid_job", SlurmPermanentError),
        ("signal_invalid_job", SlurmPermanentError),
        ("reboot_invalid_node", SlurmPermanentError),
        ("power_down_invalid_node", SlurmPermanentError),
        ("sbatch_missing_script", SlurmPermanentError),
        ("drain_unreachable", SlurmTransientError),
        ("sbatch_unreachable", SlurmTransientError),
        ("signal_unreachable", SlurmTransientError),
        ("requeue_unreachable", SlurmTransientError),
    ],
)
def test_recorded_errors_are_classified(case: str, expected: type[Exception]) -> None:
    recorded = ERRORS[case]
    client, _ = cli(Recorded(recorded["returncode"], recorded["stdout"], recorded["stderr"]))
    actions: dict[str, Callable[[], object]] = {
        "drain": lambda: client.drain("n1", "x"),
        "resume": lambda: client.resume("n1"),
        "requeue": lambda: client.requeue(3),
        "signal": lambda: client.signal_job(3),
        "reboot": lambda: client.reboot("zz9", "x"),
        "power": lambda: client.power_down("zz9"),
        "sbatch": lambda: client.submit("/x.sh", nodes=1, job_name="x"),
    }
    with pytest.raises(expected) as info:
        actions[case.split("_")[0]]()
    err = info.value
    assert isinstance(err, SlurmError)
    assert isinstance(err, PermanentError if expected is SlurmPermanentError else TransientError)
    assert recorded["stderr"].strip() in str(err)
    assert err.returncode == 1


def test_timeouts_and_missing_binaries() -> None:
    client, _ = cli(subprocess.TimeoutExpired(["sinfo"], 9.0))
    with pytest.raises(SlurmTransientError, match="timed out after 9s"):
        client.nodes()
    client, _ = cli(FileNotFoundError(2, "No such file", "scontrol"))
    with pytest.raises(SlurmPermanentError, match="not found on PATH"):
        client.drain("n1", "x")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Socket timed out on send/recv operation", SlurmTransientError),
        ("Unable to contact slurm controller (connect failure)", SlurmTransientError),
        ("Invalid job id specified", SlurmPermanentError),
        ("something nobody has seen before", SlurmPermanentError),
    ],
)
def test_classify(text: str, expected: type[Exception]) -> None:
    assert classify(text) is expected


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("", ()),
        ("n1", ("n1",)),
        ("n[1-3]", ("n1", "n2", "n3")),
        ("n[1-2,4],c1", ("n1", "n2", "n4", "c1")),
        ("gpu[08-10]", ("gpu08", "gpu09", "gpu10")),
        ("a[1-2]-ib", ("a1-ib", "a2-ib")),
    ],
)
def test_expand_hostlist(expr: str, names: tuple[str, ...]) -> None:
    assert expand_hostlist(expr) == names


def test_subprocess_runner_pins_slurm_conf_and_times_out() -> None:
    run = subprocess_runner("/tmp/some/slurm.conf")
    out = run(["sh", "-c", 'echo "$SLURM_CONF $EXTRA"'], 5.0, {"EXTRA": "x,y"})
    assert out.stdout.strip() == "/tmp/some/slurm.conf x,y"
    with pytest.raises(subprocess.TimeoutExpired):
        run(["sleep", "5"], 0.2, None)
    client = SlurmCli(runner=run, timeout_s=0.2)
    with pytest.raises(SlurmTransientError):
        client._check(["sleep", "5"])
