"""The batch scripts of one attempt: ``batch.sh`` (one srun step) and ``task.sh`` (one rank).

Each task gets the worker protocol's environment (``protocol.managed_env``) with
``RANK=$SLURM_PROCID``, ``MTC_NODE_ID`` from ``$SLURMD_NODENAME`` and ``CLUSTER_SPEC``'s task
filled in to match (Slurm, not mtc, decides which node gets which task id: see
https://slurm.schedmd.com/srun.html#SECTION_OUTPUT-ENVIRONMENT-VARIABLES), and runs under
``worker_launcher``, which leaves each rank's exit code in ``rank-<RANK>.exit``. A batch job
Slurm requeues by itself exits at once: mtc runs the next attempt instead.

Gangs: the step runs with ``srun --kill-on-bad-exit=1``, so a task that exits non-zero or is
killed ends the step for every task (https://slurm.schedmd.com/srun.html#OPT_kill-on-bad-exit),
and a killed launcher takes its command with it (``worker_launcher``). A task that was asked
to stop (the SIGTERM of a drain or cancel) reports 0 to srun (``--zero-after-stop``; its real
code stays in its exit file), so the first rank to finish its checkpoint does not kill the
ranks still saving theirs.

Quoting: everything that comes from the job (environment names and values, the command, ids,
paths) is written with ``shlex.quote`` or as a checked name; an environment variable name
that is not ``[A-Za-z_][A-Za-z0-9_]*`` is refused (``ValueError``), never written.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Mapping
from pathlib import Path

from shared.adapters.compute.protocol import LAUNCHER, managed_env
from shared.ports import Gang

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def env_name(name: str) -> str:
    """``name`` if it is a shell variable name, else ValueError: it is written unquoted."""
    if not isinstance(name, str) or ENV_NAME.fullmatch(name) is None:
        raise ValueError(f"invalid environment variable name {name!r}: must match {ENV_NAME.pattern}")
    return name


def comment(text: str) -> str:
    """``text`` made safe for a ``#`` comment line: printable ASCII only, one line."""
    return "".join(c if " " <= c <= "~" else "?" for c in text)


def write_scripts(
gang: Gang,
names: Mapping[str, str | None],
run_dir: Path,
output: Path,
*,
python: str,
master_addr: str,
) -> None:
    """Write the attempt's scripts into ``run_dir`` (``names``: mtc node id -> Slurm node).
    One task.sh serves every rank: it runs rank 0's command and environment."""
    first = next(gang.workers())
    env = managed_env(first, master_addr)
    exports = [f"export {env_name(k)}={shlex.quote(v)}" for k, v in sorted(env.items())
               if k not in ("CLUSTER_SPEC", "RANK", "MTC_NODE_ID")]  # refused before any write
    for d in (first.checkpoint_dir, first.model_dir, first.tensorboard_dir):
        Path(d).mkdir(parents=True, exist_ok=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    output.parent.mkdir(parents=True, exist_ok=True)
    for stale in run_dir.glob("*.exit"):
        stale.unlink()
    spec_doc = json.loads(env.pop("CLUSTER_SPEC"))
    spec_doc["task"]["index"] = "__MTC_RANK__"
    spec_doc["task"]["node_id"] = "__MTC_NODE__"
    template = json.dumps(spec_doc).replace('"__MTC_RANK__"', "__MTC_RANK__")
    q = shlex.quote
    lines = [
        "#!/bin/bash",
        f"# mtc job {comment(first.job_id)} attempt {first.attempt}: one rank per node, started by srun",
        "# (written by shared/adapters/compute/slurm_scripts.py; RANK is Slurm's task id)",
        'export RANK="${SLURM_PROCID:?task.sh runs under srun}"',
        'case "${SLURMD_NODENAME:-}" in',
    ]
    lines += [f"    {q(names[n] or '')}) MTC_NODE_ID={q(n)} ;;" for n in gang.node_ids]
    lines += [
        '    *) MTC_NODE_ID="${SLURMD_NODENAME:-unknown}" ;;',
        "esac",
        "export MTC_NODE_ID",
        'export MTC_SLURM_NODE="${SLURMD_NODENAME:-}"',
    ]
    lines += exports
    lines += [
        f"spec={q(template)}",
        'spec="${spec//__MTC_RANK__/$RANK}"',
        'export CLUSTER_SPEC="${spec//__MTC_NODE__/$MTC_NODE_ID}"',
        f'exec {q(python)} {q(str(LAUNCHER))} --zero-after-stop'
        f' --exit-file {q(str(run_dir))}/rank-"$RANK".exit'
        f" -- {shlex.join(first.command)}",
    ]
    write_executable(run_dir / "task.sh", "\n".join(lines) + "\n")
    k = gang.world_size
    tag = q(f"[mtc] job {first.job_id} attempt {first.attempt}")
    batch = [
        "#!/bin/bash",
        f"# mtc job {comment(first.job_id)} attempt {first.attempt}: one srun step, one task per node",
        "# (written by shared/adapters/compute/slurm_scripts.py)",
        'if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ]; then',
        f'    echo {tag}": requeued by Slurm itself; mtc runs a new attempt instead"',
        "    exit 0",
        "fi",
        f'echo {tag}": Slurm job $SLURM_JOB_ID on $SLURM_JOB_NODELIST"',
        f"srun --nodes={k} --ntasks={k} --ntasks-per-node=1 --kill-on-bad-exit=1 "
        f"{q(str(run_dir / 'task.sh'))}",
        "rc=$?",
        f'echo "$rc" > {q(str(run_dir))}/.batch.exit.tmp && mv -f {q(str(run_dir))}/.batch.exit.tmp'
        f" {q(str(run_dir))}/batch.exit",
        f'echo {tag}": srun exited $rc"',
        'exit "$rc"',
    ]
    write_executable(run_dir / "batch.sh", "\n".join(batch) + "\n")


def write_executable(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.chmod(0o755)
    os.replace(tmp, path)

