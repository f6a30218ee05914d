"""The generated batch scripts: job input is data, never shell code."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import cast

import pytest

from shared.adapters.compute.protocol import read_exit_file
from shared.adapters.compute.slurm.scripts import PeerTier, node_memory, peer_ports, write_scripts
from shared.ports import Gang, LaunchGroup

NASTY = "$(touch PWNED) `touch PWNED2` 'single' \"double\" ; touch PWNED3 \\ $HOME\nnext line"


def gang(tmp: Path, env: tuple[tuple[str, str], ...], job_id: str = "job-1") -> Gang:
    out = tmp / "out"
    command = (sys.executable, "-c", "import os; open('seen', 'w').write(os.environ['PAYLOAD'])")
    return Gang(job_id, 1, ("w0",), (LaunchGroup(0, 1, command, env),), str(out / "c"), str(out / "m"),
                str(out / "t"))


def test_env_name_injection_is_refused_and_quoted(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    work = tmp_path / "work"
    work.mkdir()
    # a bad name is refused, and nothing is written
    for bad in ("X; touch PWNED; Y", "1X", "A-B", "A B", "X=Y", "", "A\nB", "$(touch PWNED)"):
        with pytest.raises(ValueError, match="invalid environment variable name"):
            write_scripts(gang(tmp_path, ((bad, "v"),)), {"w0": "n1"}, run_dir,
                          tmp_path / "slurm.out", python=sys.executable, master_addr="127.0.0.1")
        assert not (run_dir / "task.sh").exists()
    # a hostile value (and job id) stays literal
    job_id = "j$(touch PWNED4)\ntouch PWNED5"
    write_scripts(gang(tmp_path, (("PAYLOAD", NASTY),), job_id), {"w0": "n1"}, run_dir,
                  tmp_path / "slurm.out", python=sys.executable, master_addr="127.0.0.1")
    for name in ("task.sh", "batch.sh"):
        check = subprocess.run(["bash", "-n", str(run_dir / name)], capture_output=True, text=True)
        assert check.returncode == 0, check.stderr
    bin_dir = tmp_path / "bin"  # a stand-in srun: runs the step's one task as task 0
    bin_dir.mkdir()
    (bin_dir / "srun").write_text('#!/bin/bash\nexec bash "${@: -1}"\n')
    (bin_dir / "srun").chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ.get('PATH', '')}", "SLURM_PROCID": "0",
           "SLURMD_NODENAME": "n1", "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n1"}
    done = subprocess.run(["bash", str(run_dir / "batch.sh")], cwd=work, env=env, timeout=30,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "$(touch PWNED4)" in done.stdout  # the job id, echoed literally
    assert read_exit_file(run_dir / "rank-0.exit") == 0
    assert (work / "seen").read_text() == NASTY
    assert not list(work.glob("PWNED*")) and not list(tmp_path.glob("PWNED*"))


def two_pools(tmp: Path, arg: str = "x", value_b: str = "2", name_b: str = "B") -> Gang:
    """Pool 0: one rank of ``cmd-a`` with A=1; pool 1: two ranks of ``cmd-b`` with B."""
    out = tmp / "out"
    groups = (LaunchGroup(0, 1, ("cmd-a", arg), (("A", "1"),)),
              LaunchGroup(1, 2, ("cmd-b",), ((name_b, value_b),)))
    return Gang("job-2", 1, ("w0", "w1", "w2"), groups, str(out / "c"), str(out / "m"), str(out / "t"))


NAMES = {"w0": "n3", "w1": "n1", "w2": "n2"}  # rank order is not the Slurm node order


def run_task(run_dir: Path, tmp: Path, rank: int, node: str) -> dict[str, object]:
    """task.sh as srun runs it for task ``rank`` on ``node``, with a stand-in launcher
    (the python it execs) that prints what it was given instead of running it: ``env`` is
    the command's (the launcher's ``--env-file``), ``own`` the launcher's own."""
    probe = ("import json, os, sys; a = [x for x in sys.argv[1:] if x != '-I']; "
             "f = a[a.index('--env-file') + 1]; "
             "env = dict(e.split('=', 1) for e in open(f).read().split(chr(0)) if e); "
             "print(json.dumps({'argv': a, 'env': env, 'own': dict(os.environ)}))")
    text = (run_dir / "task.sh").read_text()
    fake = tmp / "fake-python"
    fake.write_text(f"#!{sys.executable}\n{probe}\n")
    fake.chmod(0o755)
    env = {"PATH": os.environ.get("PATH", ""), "SLURM_PROCID": str(rank), "SLURMD_NODENAME": node}
    assert f" {sys.executable} -I " in text
    # the launcher's exec and the peer store's start (then a probe too, in the background)
    (run_dir / "probe.sh").write_text(text.replace(f"{sys.executable} -I ", f"{fake} -I "))
    done = subprocess.run(["bash", str(run_dir / "probe.sh")], cwd=tmp, env=env, timeout=30,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return cast("dict[str, object]", json.loads(done.stdout))


def test_each_rank_runs_its_own_pools_command_and_env(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    write_scripts(two_pools(tmp_path, arg=NASTY, value_b=NASTY), NAMES, run_dir,
                  tmp_path / "slurm.out", python=sys.executable, master_addr="10.0.0.1")
    want = {0: ("n3", "w0", ["cmd-a", NASTY], "workerpool0", 0),
            1: ("n1", "w1", ["cmd-b"], "workerpool1", 0),
            2: ("n2", "w2", ["cmd-b"], "workerpool1", 1)}
    for rank, (node, node_id, command, pool, index) in want.items():
        got = run_task(run_dir, tmp_path, rank, node)
        argv = cast("list[str]", got["argv"])
        env = cast("dict[str, str]", got["env"])
        assert argv[argv.index("--") + 1:] == command
        assert argv[argv.index("--exit-file") + 1] == str(run_dir / f"rank-{rank}.exit")
        assert env["RANK"] == str(rank) and env["WORLD_SIZE"] == "3" and env["MTC_NODE_ID"] == node_id
        own = cast("dict[str, str]", got["own"])  # the launcher's: fixed, none of the job's
        assert "RANK" not in own and "A" not in own and "B" not in own, own
        assert ("A" in env) == (rank == 0) and ("B" in env) == (rank > 0)
        assert env.get("A", "1") == "1" and env.get("B", NASTY) == NASTY
        spec = json.loads(env["CLUSTER_SPEC"])
        assert spec["task"] == {"type": pool, "index": index, "node_id": node_id}
        port = int(env["MASTER_PORT"])
        assert spec["cluster"] == {"workerpool0": [f"10.0.0.1:{port}"],
                                   "workerpool1": [f"10.0.0.1:{port + 1}", f"10.0.0.1:{port + 2}"]}
        # torchrun's node variables and Vertex's TF_CONFIG, per task (not per pool)
        assert env["GROUP_RANK"] == env["NODE_RANK"] == str(rank) and env["LOCAL_RANK"] == "0"
        tf = json.loads(env["TF_CONFIG"])
        assert tf["task"]["type"] == ("chief" if rank == 0 else "worker")
        assert tf["task"]["index"] == index
        assert tf["cluster"] == {"chief": spec["cluster"]["workerpool0"],
                                 "worker": spec["cluster"]["workerpool1"]}
    assert not list(tmp_path.glob("PWNED*")) and not list(run_dir.glob("PWNED*"))


def test_a_task_outside_every_pool_or_not_a_number_is_refused(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    write_scripts(two_pools(tmp_path), NAMES, run_dir, tmp_path / "slurm.out",
                  python=sys.executable, master_addr="10.0.0.1")
    for procid in ("3", "x[$(touch PWNED)]", ""):
        env = {"PATH": os.environ.get("PATH", ""), "SLURM_PROCID": procid, "SLURMD_NODENAME": "n1"}
        done = subprocess.run(["bash", str(run_dir / "task.sh")], cwd=tmp_path, env=env,
                              timeout=30, capture_output=True, text=True)
        assert done.returncode == 1 and "task.sh" in done.stderr
    assert not list(tmp_path.glob("PWNED*"))


def test_the_hostfile_places_each_rank_on_its_node(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    write_scripts(two_pools(tmp_path), NAMES, run_dir, tmp_path / "slurm.out",
                  python=sys.executable, master_addr="10.0.0.1")
    assert (run_dir / "hostfile").read_text() == "n3\nn1\nn2\n"  # rank order
    srun = next(line for line in (run_dir / "batch.sh").read_text().splitlines()
                if line.startswith("SLURM_HOSTFILE="))
    assert srun == (f"SLURM_HOSTFILE={run_dir / 'hostfile'} srun --nodes=3 --ntasks=3 --ntasks-per-node=1"
                    f" --kill-on-bad-exit=1 --distribution=arbitrary {run_dir / 'task.sh'}")


@pytest.mark.parametrize("bad", [{"name_b": "B; touch PWNED"}, {"name_b": "1B"}])
def test_a_bad_env_name_in_any_pool_is_refused(tmp_path: Path, bad: dict[str, str]) -> None:
    run_dir = tmp_path / "run"
    with pytest.raises(ValueError, match="invalid environment variable name"):
        write_scripts(two_pools(tmp_path, **bad), NAMES, run_dir, tmp_path / "slurm.out",
                      python=sys.executable, master_addr="10.0.0.1")
    assert not run_dir.exists()


@pytest.mark.parametrize("node", ["n1\nn2", "n[1-2]", "n1,n2", "", "-n1"])
def test_a_slurm_node_name_the_hostfile_cannot_carry_is_refused(tmp_path: Path, node: str) -> None:
    with pytest.raises(ValueError, match="invalid Slurm node name"):
        write_scripts(two_pools(tmp_path), {**NAMES, "w2": node}, tmp_path / "run",
                      tmp_path / "slurm.out", python=sys.executable, master_addr="10.0.0.1")
    assert not (tmp_path / "run").exists()


def test_a_job_whose_values_hold_task_sh_marks_is_refused(tmp_path: Path) -> None:
    """task.sh fills the CLUSTER_SPEC template by replacing its marks everywhere: a job whose
    own output path holds one would be altered silently, so it is refused instead."""
    marked = tmp_path / "__MTC_NODE__"
    with pytest.raises(ValueError, match="__MTC_NODE__"):
        write_scripts(two_pools(marked), NAMES, tmp_path / "run", tmp_path / "slurm.out",
                      python=sys.executable, master_addr="10.0.0.1")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("master, host", [("10.0.0.1", ""), ("127.0.0.1", "127.0.0.1")],
                         ids=["cluster", "one-host"])
def test_each_rank_gets_its_tiers_and_its_buddys_peer_store(tmp_path: Path, master: str,
                                                           host: str) -> None:
    """Tier 1 in its own node's memory directory (each Slurm node its own, one host or
    many); the peer copy of rank r goes over the network to the peer store of the node of
    rank (r+1) % world and is read back from the previous attempt's buddy's, with the
    attempt's token; no peer directory on the shared file system."""
    run_dir = tmp_path / "run"
    write_scripts(two_pools(tmp_path), NAMES, run_dir, tmp_path / "slurm.out",
                  python=sys.executable, master_addr=master,
                  peer=PeerTier.for_master(master, 1 << 20), previous_hosts=["n3", "n9", "n2"],
                  port_salt="salt")
    gang = two_pools(tmp_path)
    job = f"job-2-{hashlib.sha256(gang.checkpoint_dir.encode()).hexdigest()[:12]}"
    ports = peer_ports(["n1", "n2", "n3", "n9"], job, "salt")
    assert len(set(ports.values())) == 4
    token = (run_dir / "peer.token").read_text().strip()
    assert len(token) >= 32 and (run_dir / "peer.token").stat().st_mode & 0o077 == 0
    try:
        # rank 0's buddy before, n9, left the job: no service runs there, so it reads n1's
        for rank, node, buddy, before in ((0, "n3", "n1", "n1"), (1, "n1", "n2", "n2"),
                                          (2, "n2", "n3", "n3")):
            env = cast("dict[str, str]", run_task(run_dir, tmp_path, rank, node)["env"])
            # the job's storage names its entries: a job of the same id elsewhere never reads them
            assert env["MTC_TIER1_DIR"] == f"{node_memory(node, 'salt')}/{job}/rank-{rank}"
            assert env["MTC_TIER2_URL"] == f"http://{host or buddy}:{ports[buddy]}/{job}"
            assert env["MTC_TIER2_SOURCE_URL"] == f"http://{host or before}:{ports[before]}/{job}"
            assert env["MTC_TIER2_TOKEN"] == token
            assert "MTC_TIER2_DIR" not in env and "MTC_TIER2_SOURCE_DIR" not in env
            assert env["MTC_PROGRESS_FILE"] == f"{tmp_path}/out/mtc-progress/rank-{rank}.json"
        text = (run_dir / "task.sh").read_text()
        assert "peer_store.py serve" in text and "--parent-pid $$" in text
        assert f"--host {host or '0.0.0.0'}" in text and "--budget-bytes 1048576" in text
    finally:
        shutil.rmtree(node_memory("n1", "salt").parent, ignore_errors=True)


@pytest.mark.parametrize("codes, kept", [(("0", "0", "0"), False), (("0", "75", "0"), True)],
                         ids=["succeeded", "stopped"])
def test_a_finished_job_leaves_no_memory_entries_behind(tmp_path: Path, codes: tuple[str, ...],
                                                        kept: bool) -> None:
    """/dev/shm outlives the job: once every rank exited 0, batch.sh removes the job's memory
    entries on each node and its peer copies; a stopped attempt keeps them (the next one
    restores from them). srun is a stand-in here that runs its command once."""
    run_dir = tmp_path / "run"
    gang = two_pools(tmp_path)
    write_scripts(gang, NAMES, run_dir, tmp_path / "slurm.out", python=sys.executable,
                  master_addr="10.0.0.1", peer=PeerTier())
    job = f"job-2-{hashlib.sha256(gang.checkpoint_dir.encode()).hexdigest()[:12]}"
    memory, copy = node_memory("n1", "") / job / "rank-0", node_memory("n1", "") / job / "peer"
    for d in (memory, copy):
        d.mkdir(parents=True, exist_ok=True)
    for rank, code in enumerate(codes):
        (run_dir / f"rank-{rank}.exit").write_text(f"{code}\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "srun"  # skips srun's options; task.sh is the step itself: done already
    fake.write_text('#!/bin/bash\nwhile [[ "$1" == --* ]]; do shift; done\n'
                    '[[ "$1" == */task.sh ]] && exit 0\nexec "$@"\n')
    fake.chmod(0o755)
    try:
        done = subprocess.run(["bash", str(run_dir / "batch.sh")], capture_output=True,
                              text=True, env={**os.environ, "SLURMD_NODENAME": "n1",
                                              "PATH": f"{bin_dir}:{os.environ['PATH']}"})
        assert done.returncode == 0, done.stderr
        assert memory.exists() is kept and copy.exists() is kept
    finally:
        shutil.rmtree(memory.parent.parent.parent, ignore_errors=True)  # the deployment's


def test_each_task_has_its_own_tmpdir_and_batch_sh_removes_them(tmp_path: Path) -> None:
    """torch's caches and torchrun's files go to a TMPDIR of the rank's own on its node,
    removed after the step whatever its outcome (srun a stand-in that runs its command
    once); a job that names its own TMPDIR keeps it."""
    from shared.adapters.compute.slurm.scripts import tmp_root

    run_dir = tmp_path / "run"
    gang = two_pools(tmp_path)
    write_scripts(gang, NAMES, run_dir, tmp_path / "slurm.out", python=sys.executable,
                  master_addr="10.0.0.1")
    root = tmp_root(gang)
    try:
        seen = [cast("dict[str, str]", run_task(run_dir, tmp_path, r, n)["env"])["TMPDIR"]
                for r, n in ((0, "n3"), (1, "n1"))]
        assert seen == [f"{root}-r0", f"{root}-r1"] and all(Path(s).is_dir() for s in seen)
        (Path(seen[0]) / "torchelastic_x").mkdir()
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        fake = bin_dir / "srun"
        fake.write_text('#!/bin/bash\nwhile [[ "$1" == --* ]]; do shift; done\n'
                        '[[ "$1" == */task.sh ]] && exit 75\nexec "$@"\n')
        fake.chmod(0o755)
        done = subprocess.run(["bash", str(run_dir / "batch.sh")], capture_output=True,
                              text=True, env={**os.environ,
                                              "PATH": f"{bin_dir}:{os.environ['PATH']}"})
        assert done.returncode == 75, done.stderr
        assert not any(Path(s).exists() for s in seen)
    finally:
        for r in range(3):
            shutil.rmtree(f"{root}-r{r}", ignore_errors=True)
    mine = two_pools(tmp_path, name_b="TMPDIR", value_b=str(tmp_path / "mine"))
    write_scripts(mine, NAMES, run_dir, tmp_path / "slurm.out", python=sys.executable,
                  master_addr="10.0.0.1")
    try:
        got = cast("dict[str, str]", run_task(run_dir, tmp_path, 1, "n1")["env"])
        assert got["TMPDIR"] == str(tmp_path / "mine")
    finally:
        for r in range(3):
            shutil.rmtree(f"{tmp_root(mine)}-r{r}", ignore_errors=True)


def test_a_warm_allocation_runs_each_attempts_step_until_released(tmp_path: Path) -> None:
    """Warm processes: batch.sh runs its attempt's step, then each ordered attempt's step in
    the same allocation (srun a stand-in: every task exits 1), and exits once released;
    each step runs with --overlap and without --kill-on-bad-exit, and task.sh offers the
    in-process restart and hands a taken rank over."""
    from shared.adapters.compute.slurm import warm_scripts

    first, second = tmp_path / "attempt-1", tmp_path / "attempt-2"
    gang = two_pools(tmp_path)
    for run_dir, g in ((first, gang), (second, Gang(gang.job_id, 2, gang.node_ids, gang.groups,
                                                     gang.checkpoint_dir, gang.model_dir,
                                                     gang.tensorboard_dir))):
        write_scripts(g, NAMES, run_dir, tmp_path / "slurm.out", python=sys.executable,
                      master_addr="10.0.0.1", warm=True)
    step = (second / "step.sh").read_text()
    assert "--overlap" in step and "--kill-on-bad-exit=0" in step
    assert "--kill-on-bad-exit=1" not in step
    task = (second / "task.sh").read_text()
    assert "export MTC_RESTART_FILE=" in task and "handover.py" in task
    for name in ("batch.sh", "step.sh", "task.sh"):
        check = subprocess.run(["bash", "-n", str(second / name)], capture_output=True, text=True)
        assert check.returncode == 0, (name, check.stderr)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "srun"
    fake.write_text('#!/bin/bash\nwhile [[ "$1" == --* ]]; do shift; done\n'
                    '[[ "$1" == */task.sh ]] && exit 1\nexec "$@"\n')
    fake.chmod(0o755)
    batch = subprocess.Popen(["bash", str(first / "batch.sh")], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    try:
        until = time.monotonic() + 20
        while not (first / "step.exit").exists():
            assert time.monotonic() < until and batch.poll() is None, "attempt 1's step"
            time.sleep(0.05)
        warm_scripts.order(first, 2, second)
        while not (second / "step.exit").exists():
            assert time.monotonic() < until and batch.poll() is None, "attempt 2's step"
            time.sleep(0.05)
        assert (first / "step.exit").read_text().strip() == "1"
        warm_scripts.release(first)
        out, err = batch.communicate(timeout=10)
    finally:
        batch.kill()
    assert batch.returncode == 0, err
    assert "[mtc] job job-2 attempt 2: a step of Slurm job" in out
