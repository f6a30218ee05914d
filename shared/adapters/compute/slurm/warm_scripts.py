"""The scripts of a warm attempt on Slurm: the job's allocation outlives its attempts.

``batch.sh`` of the attempt that asked Slurm for the allocation (its *host*) runs that
attempt's ``step.sh`` in the background, then waits for the next ones: each in-place,
hot-swap or scale-down attempt that reuses the allocation leaves ``next-<attempt>`` (its
run directory) in the host's run directory and ``batch.sh`` starts its ``step.sh``. It exits
when the adapter leaves ``release`` (a requeue, the job done) or when no step has run for
``IDLE_S`` (the job over with nothing left to order; a held process ends by its own
deadline before that), and Slurm ends what still runs of the job.

``step.sh`` is the attempt's one ``srun`` step, run with ``--overlap`` (held processes of the
previous attempt still run in theirs on the same nodes) and without ``--kill-on-bad-exit``:
when a rank fails, the others are not killed but held by the adapter, which orders them
through their control files (``MTC_RESTART_FILE``, a file per rank in the run directory, on
the shared file system as every run directory is), or signalled where their program does
not restart in process. ``step.exit`` holds srun's code once the step is over.

In ``task.sh`` (``task_lines``, ``handover_lines``): a rank the adapter gave a held process
(``rank-<RANK>.take``) keeps the node's peer store service that process's task still runs (on
the job's port, with the allocation's token: every attempt in an allocation has its host's;
``rank-<RANK>.oldpeer`` names its pid file) instead of starting one, and hands itself over
(``handover``) instead of starting a launcher.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from mtc_program import protocol as p
from shared.adapters.compute.job_env import LAUNCHER_ENV
from shared.adapters.compute.slurm.script_files import comment, write_executable
from shared.ports import Gang

HANDOVER = Path(__file__).with_name("handover.py")
IDLE_S = 40.0  # no step for this long: the allocation goes (above a hold's deadline)
TICK_S = 0.05  # how often batch.sh looks for the next attempt


def task_lines(run_dir: Path) -> list[str]:
    """task.sh: the rank's control file, and the old peer store of a held process's node."""
    q = shlex.quote
    d = q(str(run_dir))
    return [
        f'export {p.RESTART_FILE}={d}/rank-"$RANK".ctl/restart.json',
        f'mkdir -p {d}/rank-"$RANK".ctl || exit 1',
        f'rm -f "${p.RESTART_FILE}" "${p.RESTART_FILE}.state"',
        # a held process's task still runs its node's peer store, on the job's port and with
        # the allocation's token: the rank that takes the process keeps it (``kept_peer``)
        f'if [ -f {d}/rank-"$RANK".take ] && old=$(cat {d}/rank-"$RANK".oldpeer 2>/dev/null)'
        ' && old_pid=$(cat "$old" 2>/dev/null) \\',
        '        && grep -qa peer_store "/proc/$old_pid/cmdline" 2>/dev/null; then',
        '    kept_peer=$old_pid',
        "fi",
    ]


def handover_lines(run_dir: Path, python: str) -> list[str]:
    """task.sh, last: a rank given a held process hands itself over instead of launching."""
    q = shlex.quote
    d = q(str(run_dir))
    fixed = " ".join(f"{k}={q(v)}" for k, v in LAUNCHER_ENV.items())
    return [
        f'if [ -f {d}/rank-"$RANK".take ]; then',
        f'    exec /usr/bin/env -i {fixed} RANK="$RANK" {q(python)} -I -S {q(str(HANDOVER))}'
        f' --take {d}/rank-"$RANK".take --env-file "$env_file" --exit-file {d}/rank-"$RANK".exit',
        "fi",
    ]


def write(gang: Gang, run_dir: Path, tmp_root: str, cleanup: list[str]) -> None:
    """The attempt's ``step.sh``, and the ``batch.sh`` that runs it first in an allocation
    of its own (used only where the attempt asks Slurm for one)."""
    q = shlex.quote
    k = gang.world_size
    d = q(str(run_dir))
    tag = q(f"[mtc] job {gang.job_id} attempt {gang.attempt}")
    hosts = f"SLURM_HOSTFILE={q(str(run_dir / 'hostfile'))}"
    step = [
        "#!/bin/bash",
        f"# mtc job {comment(gang.job_id)} attempt {gang.attempt}: its step in the job's allocation",
        "# (written by shared/adapters/compute/slurm/warm_scripts.py)",
        f'echo {tag}": a step of Slurm job $SLURM_JOB_ID"',
        f"{hosts} srun --overlap --nodes={k} --ntasks={k} --ntasks-per-node=1"
        f" --kill-on-bad-exit=0 --distribution=arbitrary {q(str(run_dir / 'task.sh'))}",
        "rc=$?",
        f"{hosts} srun --overlap --nodes={k} --ntasks={k} --ntasks-per-node=1"
        f" --distribution=arbitrary /bin/sh -c {q(f'rm -rf {q(tmp_root)}-r*')} || true",
        *cleanup,
        f'echo "$rc" > {d}/.step.exit.tmp && mv -f {d}/.step.exit.tmp {d}/step.exit',
        # not the attempt's mark (``[mtc] job J attempt N: ``): the step of an attempt long
        # over ends when the processes it started do, among the lines of a later attempt
        f'echo {q(f"[mtc] the step of job {gang.job_id} attempt {gang.attempt} exited")}" $rc"',
    ]
    write_executable(run_dir / "step.sh", "\n".join(step) + "\n")
    batch = [
        "#!/bin/bash",
        f"# mtc job {comment(gang.job_id)}: the allocation of its attempts from {gang.attempt} on",
        "# (written by shared/adapters/compute/slurm/warm_scripts.py)",
        'if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ]; then',
        f'    echo {tag}": requeued by Slurm itself; mtc runs a new attempt instead"',
        "    exit 0",
        "fi",
        f'echo {q(f"[mtc] job {gang.job_id}: Slurm job")}" $SLURM_JOB_ID on $SLURM_JOB_NODELIST"'
        ' "(kept for its next attempts)"',
        f"{q(str(run_dir / 'step.sh'))} &",
        "exec 3<> <(:)  # a pipe nobody writes: read -t on it waits without a fork per tick",
        "tick=0 idle=0",
        f"while [ ! -e {d}/release ]; do",
        f"    for order in {d}/next-*; do",
        '        [ -f "$order" ] || continue',
        '        next=$(cat "$order") && rm -f "$order" || continue',
        '        "$next/step.sh" &',
        "    done",
        "    tick=$((tick + 1))",
        f"    if (( tick % {int(1 / TICK_S)} == 0 )); then  # once a second: does a step run?",
        '        if [ -n "$(jobs -rp)" ]; then idle=0; else idle=$((idle + 1)); fi',
        f'        [ "$idle" -ge {int(IDLE_S)} ] && break',
        "    fi",
        f"    read -r -t {TICK_S} -u 3 _ || true",
        "done",
        f'echo {q(f"[mtc] job {gang.job_id}: allocation released")}',
        "exit 0",
    ]
    write_executable(run_dir / "batch.sh", "\n".join(batch) + "\n")


def order(alloc_dir: Path, attempt: int, run_dir: Path) -> None:
    """Ask the allocation's ``batch.sh`` to run the attempt's step."""
    tmp = alloc_dir / f".next-{attempt:06d}.tmp"
    tmp.write_text(str(run_dir))
    os.replace(tmp, alloc_dir / f"next-{attempt:06d}")


def release(alloc_dir: Path) -> None:
    """The allocation is not wanted any more: ``batch.sh`` exits, Slurm ends its steps."""
    (alloc_dir / "release").touch()
