"""The batch scripts of one attempt: ``batch.sh`` (one srun step) and ``task.sh`` (one rank).

Each task gets the worker protocol's environment (``protocol.managed_env``) with
``RANK=$SLURM_PROCID``, ``MTC_NODE_ID`` from ``$SLURMD_NODENAME`` and ``CLUSTER_SPEC``'s task
filled in to match (Slurm, not mtc, decides which node gets which task id: see
https://slurm.schedmd.com/srun.html#SECTION_OUTPUT-ENVIRONMENT-VARIABLES), and runs under
``worker_launcher``, which leaves each rank's exit code in ``rank-<RANK>.exit``. A batch job
Slurm requeues by itself exits at once: mtc runs the next attempt instead.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path

from shared.adapters.compute.protocol import LAUNCHER, managed_env
from shared.ports import WorkerSpec


def write_scripts(
specs: Sequence[WorkerSpec],
names: Mapping[str, str | None],
run_dir: Path,
output: Path,
*,
python: str,
master_addr: str,
) -> None:
    """Write the attempt's scripts into ``run_dir`` (``specs``: one per rank, by rank;
    ``names``: mtc node id -> Slurm node)."""
    first = specs[0]
    for d in (first.checkpoint_dir, first.model_dir, first.tensorboard_dir):
        Path(d).mkdir(parents=True, exist_ok=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    output.parent.mkdir(parents=True, exist_ok=True)
    for stale in run_dir.glob("*.exit"):
        stale.unlink()
    env = managed_env(first, master_addr)
    spec_doc = json.loads(env.pop("CLUSTER_SPEC"))
    spec_doc["task"]["index"] = "__MTC_RANK__"
    spec_doc["task"]["node_id"] = "__MTC_NODE__"
    template = json.dumps(spec_doc).replace('"__MTC_RANK__"', "__MTC_RANK__")
    for var in ("RANK", "MTC_NODE_ID"):
        env.pop(var, None)
    q = shlex.quote
    lines = [
        "#!/bin/bash",
        f"# mtc job {first.job_id} attempt {first.attempt}: one rank per node, started by srun",
        "# (written by shared/adapters/compute/slurm_scripts.py; RANK is Slurm's task id)",
        'export RANK="${SLURM_PROCID:?task.sh runs under srun}"',
        'case "${SLURMD_NODENAME:-}" in',
    ]
    lines += [f"    {q(names[s.node_id] or '')}) MTC_NODE_ID={q(s.node_id)} ;;" for s in specs]
    lines += [
        '    *) MTC_NODE_ID="${SLURMD_NODENAME:-unknown}" ;;',
        "esac",
        "export MTC_NODE_ID",
        'export MTC_SLURM_NODE="${SLURMD_NODENAME:-}"',
    ]
    lines += [f"export {k}={q(v)}" for k, v in sorted(env.items())]
    lines += [
        f"spec={q(template)}",
        'spec="${spec//__MTC_RANK__/$RANK}"',
        'export CLUSTER_SPEC="${spec//__MTC_NODE__/$MTC_NODE_ID}"',
        f'exec {q(python)} {q(str(LAUNCHER))} --exit-file {q(str(run_dir))}/rank-"$RANK".exit'
        f" -- {shlex.join(first.command)}",
    ]
    write_executable(run_dir / "task.sh", "\n".join(lines) + "\n")
    k = len(specs)
    tag = f"[mtc] job {first.job_id} attempt {first.attempt}"
    batch = [
        "#!/bin/bash",
        f"# mtc job {first.job_id} attempt {first.attempt}: one srun step, one task per node",
        "# (written by shared/adapters/compute/slurm_scripts.py)",
        'if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ]; then',
        f'    echo "{tag}: requeued by Slurm itself; mtc runs a new attempt instead"',
        "    exit 0",
        "fi",
        f'echo "{tag}: Slurm job $SLURM_JOB_ID on $SLURM_JOB_NODELIST"',
        f"srun --nodes={k} --ntasks={k} --ntasks-per-node=1 --kill-on-bad-exit=0 "
        f"{q(str(run_dir / 'task.sh'))}",
        "rc=$?",
        f'echo "$rc" > {q(str(run_dir))}/.batch.exit.tmp && mv -f {q(str(run_dir))}/.batch.exit.tmp'
        f" {q(str(run_dir))}/batch.exit",
        f'echo "{tag}: srun exited $rc"',
        'exit "$rc"',
    ]
    write_executable(run_dir / "batch.sh", "\n".join(batch) + "\n")



def write_executable(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.chmod(0o755)
    os.replace(tmp, path)

