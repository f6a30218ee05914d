"""The batch scripts of one attempt: ``batch.sh`` (one srun step), ``task.sh`` (one rank)
and ``hostfile``.

Placement: srun puts task r on line r of ``hostfile``, the Slurm node of ``gang.node_ids[r]``
(``--distribution=arbitrary`` with ``SLURM_HOSTFILE``:
https://slurm.schedmd.com/srun.html#OPT_distribution), so a pool's ranks run on the machines
chosen for that pool, not wherever Slurm's own order would put them.

Pools: one ``task.sh`` serves every rank. It takes ``RANK=$SLURM_PROCID``, picks the launch
group whose ranks hold it (``if (( RANK < end ))`` per group) and exports that group's
environment (``protocol.managed_env``) and command (a bash array); ``MTC_NODE_ID`` comes from
``$SLURMD_NODENAME`` and ``CLUSTER_SPEC``'s task index (``RANK`` less the group's first rank)
and node are filled in by the shell. It runs the command under ``worker_launcher``, which
leaves each rank's exit code in ``rank-<RANK>.exit``. A batch job Slurm requeues by itself
exits at once: mtc runs the next attempt instead.

Checkpoint tiers (``protocol.tier_env``'s layout, computed by the shell so the script stays
one per pool, not per rank). A node's memory directory is
``/dev/shm/mtc/<deployment>/<Slurm node>`` (``node_memory``: the node's name keeps the
simulated nodes of a one-host cluster apart, the deployment's tag the clusters of several
deployments on one host); tier 1 is ``<it>/<job>-<hash of its checkpoint
directory>/rank-$RANK``. The tier-2 copy travels over the network: each task first starts
its node's peer store service (``mtc_program.peer_store``, in the background, ending with
the task) on the port ``peer_ports`` gave that node, owning the node's memory directory
with the adapter's byte budget, and the rank sends its copy to the service of its buddy
(line ``(r + 1) % world`` of ``hostfile``: ``MTC_TIER2_URL``) and reads it back from the
previous attempt's buddy's (``prev-hostfile``: ``MTC_TIER2_SOURCE_URL``), with the attempt's
token (``peer.token``, 0600 in the run directory; ``MTC_TIER2_TOKEN``). Nothing of the copy
goes through the shared file system, so a node's loss costs only its own memory.

Gangs: the step runs with ``srun --kill-on-bad-exit=1``, so a task that exits non-zero or is
killed ends the step for every task (https://slurm.schedmd.com/srun.html#OPT_kill-on-bad-exit),
and a killed launcher takes its command with it (``worker_launcher``). A task that was asked
to stop (the SIGTERM of a drain or cancel) reports 0 to srun (``--zero-after-stop``; its real
code stays in its exit file), so the first rank to finish its checkpoint does not kill the
ranks still saving theirs.

Quoting: everything that comes from the job (environment names and values, the command, ids,
paths) is written with ``shlex.quote`` or as a checked name; an environment variable name
that is not ``[A-Za-z_][A-Za-z0-9_]*``, or a Slurm node name the hostfile cannot carry as one
host, is refused (``ValueError``), never written. A ``SLURM_PROCID`` that is not a number
ends the task before it reaches shell arithmetic.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
import secrets
import shlex
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from mtc_program import peer_store
from mtc_program import protocol as p
from shared.adapters.compute.job_env import LAUNCHER_ENV
from shared.adapters.compute.protocol import LAUNCHER, managed_env, progress_path, safe_name
from shared.adapters.compute.slurm import warm_scripts
from shared.adapters.compute.slurm.script_files import comment, write_executable
from shared.ports import Gang, RecoveryPlan, WorkerSpec

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SLURM_NODE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
MEMORY_ROOT = Path("/dev/shm/mtc")  # tmpfs: the node's memory
PEER_STORE = Path(peer_store.__file__)
PEER_PORT_BASE, PEER_PORT_SPAN = 12000, 4000  # below the master ports and the ephemeral range


@dataclass(frozen=True)
class PeerTier:
    """How the attempt's peer tier runs: ``host``, the address every node's service is
    reached at (a one-host cluster's loopback) or "" for each buddy's Slurm node name;
    ``budget_bytes``, each node's memory for the copies it holds."""

    host: str = ""
    budget_bytes: int = peer_store.DEFAULT_BUDGET_BYTES

    @classmethod
    def for_master(cls, master_addr: str, budget_bytes: int) -> PeerTier:
        """A loopback master address means every node is this host."""
        try:
            loopback = ipaddress.ip_address(master_addr).is_loopback
        except ValueError:
            loopback = master_addr == "localhost"
        return cls(master_addr if loopback else "", budget_bytes)


def memory_root(deployment: str) -> Path:
    """Where the deployment's nodes' memory directories are on each node: the deployment (its
    state directory) names it, because one-host clusters of several deployments have nodes
    of the same names, and one's reboot of its ``n2`` must not wipe another's."""
    return MEMORY_ROOT / hashlib.sha256(deployment.encode()).hexdigest()[:12]


def node_memory(slurm_node: str, deployment: str) -> Path:
    """A node's memory directory (tier 1 and the peer copies its service holds)."""
    return memory_root(deployment) / safe_name(slurm_node)


def peer_ports(nodes: Sequence[str], job: str, salt: str) -> dict[str, int]:
    """Each node's peer store port for this job's attempt, from the deployment, the job and
    the node (one host's simulated nodes and two jobs sharing a node never share one); a
    clash within the attempt moves to the next port."""
    out: dict[str, int] = {}
    for node in sorted(set(nodes)):
        offset = zlib.crc32(f"{salt}/{job}/{node}".encode()) % PEER_PORT_SPAN
        while PEER_PORT_BASE + offset in out.values():
            offset = (offset + 1) % PEER_PORT_SPAN
        out[node] = PEER_PORT_BASE + offset
    return out


def env_name(name: str) -> str:
    """``name`` if it is a shell variable name, else ValueError: it is written unquoted."""
    if not isinstance(name, str) or ENV_NAME.fullmatch(name) is None:
        raise ValueError(f"invalid environment variable name {name!r}: must match {ENV_NAME.pattern}")
    return name


def write_scripts(
    gang: Gang,
    names: Mapping[str, str | None],
    run_dir: Path,
    output: Path,
    *,
    python: str,
    master_addr: str,
    peer: PeerTier | None = None,
    previous_hosts: Sequence[str] = (),
    port_salt: str = "",
    warm: bool = False,
) -> None:
    """Write the attempt's scripts into ``run_dir`` (``names``: mtc node id -> Slurm node):
    ``hostfile`` (rank r's Slurm node on line r, so srun puts each pool's ranks on the
    machines chosen for them), one ``task.sh`` that picks its launch group's command and
    environment by ``$RANK``, and ``batch.sh``. ``peer``: how the tiers' peer stores run
    (none: no tiers); ``previous_hosts``: the Slurm nodes
    of the job's previous attempt by rank (where its peer copies are); ``port_salt``: see
    ``master_port``; ``warm``: the attempt runs as a step of an allocation that outlives
    it (``warm_scripts``: ``batch.sh`` loops over the job's attempts, ``step.sh`` is this
    one's step), its ranks are offered in-process restart (``MTC_RESTART_FILE``) and a rank
    the adapter gave a held process (``rank-<RANK>.take``) hands itself to it
    (``handover``). Job input the scripts cannot carry safely is refused (``ValueError``)
    before anything is written."""
    pools = tuple(g.count for g in gang.groups)
    envs = [managed_env(WorkerSpec(gang.job_id, gang.attempt, g.first_rank, gang.world_size,
                                   gang.node_ids[g.first_rank], g.command, g.env, gang.checkpoint_dir,
                                   gang.model_dir, gang.tensorboard_dir), master_addr, pools,
                        recovery=gang.recovery, port_salt=port_salt)
            for g in gang.groups]
    templates = [spec_template(env.pop(p.CLUSTER_SPEC)) for env in envs]
    tf_templates = [spec_template(env.pop(p.TF_CONFIG)) for env in envs]
    exports = [{env_name(k): v for k, v in env.items() if k not in PER_TASK} for env in envs]
    common = set.intersection(*(set(e.items()) for e in exports))
    hosts = [slurm_node(names.get(n)) for n in gang.node_ids]
    for d in (gang.checkpoint_dir, gang.model_dir, gang.tensorboard_dir):
        Path(d).mkdir(parents=True, exist_ok=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    output.parent.mkdir(parents=True, exist_ok=True)
    for stale in [*run_dir.glob("*.exit"), *run_dir.glob("rank-*.take")]:
        stale.unlink()
    q = shlex.quote
    lines = [
        "#!/bin/bash",
        f"# mtc job {comment(gang.job_id)} attempt {gang.attempt}: one rank per node, started by srun",
        "# (written by shared/adapters/compute/slurm/scripts.py; RANK is Slurm's task id, placed",
        "# on its node by the hostfile)",
        'export RANK="${SLURM_PROCID:?task.sh runs under srun}"',
        'case "$RANK" in',
        "    ''|*[!0-9]*) echo \"task.sh: SLURM_PROCID is not a task id: $RANK\" >&2; exit 1 ;;",
        "esac",
        'case "${SLURMD_NODENAME:-}" in',
    ]
    plan = gang.recovery
    lines += [f"    {q(names[n] or '')}) {p.NODE_ID}={q(n)}{_fresh_mark(plan, n)} ;;"
              for n in gang.node_ids]
    lines += [
        f'    *) {p.NODE_ID}="${{SLURMD_NODENAME:-unknown}}" ;;',
        "esac",
        f"export {p.NODE_ID}",
        *([f"export {p.RECOVERY_FRESH}"] if plan is not None else []),
        'export MTC_SLURM_NODE="${SLURMD_NODENAME:-}"',
    ]
    lines.append("kept_peer=")
    if warm:  # before the peer store: a held process's task still runs the node's
        lines += warm_scripts.task_lines(run_dir)
    if peer is not None:
        whole = previous_hosts and all(h and SLURM_NODE.fullmatch(h) for h in previous_hosts)
        prev = list(previous_hosts) if whole else hosts  # else: as if placed as now
        write_executable(run_dir / "prev-hostfile", "\n".join(prev) + "\n", mode=0o644)
        write_executable(run_dir / "peer.token", secrets.token_urlsafe(32) + "\n", mode=0o600)
        ports = peer_ports([*hosts, *prev], memory_name(gang), port_salt)
        lines += tier_lines(gang, run_dir, peer, ports, python, port_salt)
    # a TMPDIR of the rank's own on its node (the job's own TMPDIR, exported below, wins):
    # torch's caches and torchrun's files go with the attempt (batch.sh removes them)
    lines += [f'export TMPDIR={q(tmp_root(gang))}-r"$RANK"',
              '(umask 077 && mkdir -p "$TMPDIR") || exit 1']
    lines += [f"export {k}={q(v)}" for k, v in sorted(common)]
    for i, (g, env, template, tf) in enumerate(zip(gang.groups, exports, templates, tf_templates,
                                                   strict=True)):
        end = g.first_rank + g.count
        lines.append(f"{'if' if i == 0 else 'elif'} (( RANK < {end} )); then"
                     f"  # workerpool{i}: ranks {g.first_rank}-{end - 1}")
        lines.append(f"    first={g.first_rank}")
        lines += [f"    export {k}={q(v)}" for k, v in sorted(env.items()) if (k, v) not in common]
        lines.append(f"    spec={q(template)}")
        lines.append(f"    tf={q(tf)}")
        lines.append(f"    cmd=({' '.join(q(a) for a in g.command)})")
    lines += [
        "else",
        '    echo "task.sh: rank $RANK is in no worker pool of this attempt" >&2',
        "    exit 1",
        "fi",
        'spec="${spec//__MTC_INDEX__/$((RANK - first))}"',
        f'export {p.CLUSTER_SPEC}="${{spec//__MTC_NODE__/${p.NODE_ID}}}"',
        'tf="${tf//__MTC_INDEX__/$((RANK - first))}"',
        f'export {p.TF_CONFIG}="${{tf//__MTC_NODE__/${p.NODE_ID}}}"',
        'export GROUP_RANK="$RANK" NODE_RANK="$RANK"',
        # the job's environment goes to the launcher in a file, for the command only: the
        # launcher runs isolated with a fixed environment (job_env)
        f'env_file={q(str(run_dir))}/rank-"$RANK".env',
        '(umask 077 && /usr/bin/env -0 > "$env_file") || exit 1',
        *(warm_scripts.handover_lines(run_dir, python) if warm else []),
        f'exec /usr/bin/env -i {" ".join(f"{k}={q(v)}" for k, v in LAUNCHER_ENV.items())}'
        f' {q(python)} -I {q(str(LAUNCHER))} --zero-after-stop'
        f' --exit-file {q(str(run_dir))}/rank-"$RANK".exit --env-file "$env_file"'
        ' -- "${cmd[@]}"',
    ]
    write_executable(run_dir / "hostfile", "\n".join(hosts) + "\n", mode=0o644)
    write_executable(run_dir / "task.sh", "\n".join(lines) + "\n")
    if warm:
        cleanup = _cleanup_lines(gang, run_dir, gang.world_size, port_salt, overlap=True) \
            if peer is not None else []
        warm_scripts.write(gang, run_dir, tmp_root(gang), cleanup)
        return
    k = gang.world_size
    tag = q(f"[mtc] job {gang.job_id} attempt {gang.attempt}")
    batch = [
        "#!/bin/bash",
        f"# mtc job {comment(gang.job_id)} attempt {gang.attempt}: one srun step, one task per node",
        "# (written by shared/adapters/compute/slurm/scripts.py)",
        'if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ]; then',
        f'    echo {tag}": requeued by Slurm itself; mtc runs a new attempt instead"',
        "    exit 0",
        "fi",
        f'echo {tag}": Slurm job $SLURM_JOB_ID on $SLURM_JOB_NODELIST"',
        f"SLURM_HOSTFILE={q(str(run_dir / 'hostfile'))} srun --nodes={k} --ntasks={k}"
        f" --ntasks-per-node=1 --kill-on-bad-exit=1 --distribution=arbitrary"
        f" {q(str(run_dir / 'task.sh'))}",
        "rc=$?",
        f"SLURM_HOSTFILE={q(str(run_dir / 'hostfile'))} srun --nodes={k} --ntasks={k}"
        f" --ntasks-per-node=1 --distribution=arbitrary /bin/sh -c"
        f" {q(f'rm -rf {q(tmp_root(gang))}-r*')} || true",
        *(_cleanup_lines(gang, run_dir, k, port_salt) if peer is not None else []),
        f'echo "$rc" > {q(str(run_dir))}/.batch.exit.tmp && mv -f {q(str(run_dir))}/.batch.exit.tmp'
        f" {q(str(run_dir))}/batch.exit",
        f'echo {tag}": srun exited $rc"',
        'exit "$rc"',
    ]
    write_executable(run_dir / "batch.sh", "\n".join(batch) + "\n")


def memory_name(gang: Gang) -> str:
    """The job's directory name under ``/dev/shm/mtc``. /dev/shm outlives the job and is
    shared by every deployment on the node: the job's own storage (its checkpoint directory)
    names its entries, so a job of the same id in another state directory never restores
    this one's state (as with durable checkpoints)."""
    return f"{safe_name(gang.job_id)}-{hashlib.sha256(gang.checkpoint_dir.encode()).hexdigest()[:12]}"


def tmp_root(gang: Gang) -> str:
    """Where the attempt's ranks' TMPDIRs are on their nodes (``-r<rank>`` appended)."""
    return f"/tmp/mtc-{memory_name(gang)}-a{gang.attempt}"


def _cleanup_lines(gang: Gang, run_dir: Path, k: int, deployment: str,
                   overlap: bool = False) -> list[str]:
    """batch.sh, after the step: when every rank exited 0 the job is done, and its memory
    entries and the peer copies on each node go with it; /dev/shm would keep them until a
    reboot (a stopped or failed attempt keeps them: the next one restores from them)."""
    q = shlex.quote
    rm = f'rm -rf {q(str(memory_root(deployment)))}/"$SLURMD_NODENAME"/{q(memory_name(gang))}'
    return [
        f'if [ "$rc" = 0 ] && ! grep -qvx 0 {q(str(run_dir))}/rank-*.exit 2>/dev/null; then',
        f"    SLURM_HOSTFILE={q(str(run_dir / 'hostfile'))} srun --nodes={k} --ntasks={k}"
        f" --ntasks-per-node=1 --distribution=arbitrary{' --overlap' if overlap else ''}"
        f" /bin/sh -c {q(rm)}",
        "fi",
    ]


def tier_lines(gang: Gang, run_dir: Path, peer: PeerTier, ports: Mapping[str, int],
               python: str, deployment: str) -> list[str]:
    """task.sh's checkpoint tier variables for ``$RANK`` and its node's peer store, started
    in the background before the launcher (see the module docstring). The service watches
    the task's pid (``$$``, which the launcher's exec keeps) and exits with it."""
    q = shlex.quote
    job = memory_name(gang)
    progress = progress_path(gang.checkpoint_dir, 0).parent
    token = q(str(run_dir / "peer.token"))
    cases = " ".join(f"{q(node)}) echo {port} ;;" for node, port in sorted(ports.items()))
    return [
        f"tier_world={gang.world_size}",
        f'buddy=$(sed -n "$(( (RANK + 1) % tier_world + 1 ))p" {q(str(run_dir / "hostfile"))})',
        f'prev_world=$(wc -l < {q(str(run_dir / "prev-hostfile"))})',
        f'prev_buddy=$(sed -n "$(( (RANK + 1) % prev_world + 1 ))p" {q(str(run_dir / "prev-hostfile"))})',
        # a node outside this attempt runs no service (it lives with a task): read the buddy's
        f'grep -qxF -- "$prev_buddy" {q(str(run_dir / "hostfile"))} || prev_buddy=$buddy',
        f'peer_port() {{ case "$1" in {cases} *) echo 0 ;; esac; }}',
        f"peer_host={q(peer.host)}",
        f'peer_url() {{ echo "http://${{peer_host:-$1}}:$(peer_port "$1")/{job}"; }}',
        f'node_mem={q(str(memory_root(deployment)))}/"${{SLURMD_NODENAME:?task.sh runs under srun}}"',
        f'export {p.TIER1_DIR}="$node_mem"/{q(job)}/rank-"$RANK"',
        f'export {p.TIER2_URL}="$(peer_url "$buddy")"',
        f'export {p.TIER2_SOURCE_URL}="$(peer_url "$prev_buddy")"',
        f'{p.TIER2_TOKEN}="$(cat {token})" || exit 1',
        f"export {p.TIER2_TOKEN}",
        f'export {p.PROGRESS_FILE}={q(str(progress))}/rank-"$RANK".json',
        '(umask 077 && mkdir -p "$node_mem") || exit 1',
        # kept_peer: the node's service of a held process's task goes on (warm_scripts)
        'if [ -z "${kept_peer:-}" ]; then',
        f"    {q(python)} -I {q(str(PEER_STORE))} serve --root \"$node_mem\" --token-file {token}"
        f" --host {q(peer.host or '0.0.0.0')} --port \"$(peer_port \"$SLURMD_NODENAME\")\""
        f" --budget-bytes {int(peer.budget_bytes)} --parent-pid $$"
        f' >> {q(str(run_dir))}/peer-store-"$RANK".log 2>&1 < /dev/null &',
        '    kept_peer=$!',
        "fi",
        f'echo "$kept_peer" > {q(str(run_dir))}/peer-store-"$RANK".pid',
    ]


# set per task by task.sh from Slurm's task id, not exported per pool
PER_TASK = (p.RANK, p.NODE_ID, p.GROUP_RANK, p.NODE_RANK, p.RECOVERY_FRESH)


def spec_template(cluster_spec: str) -> str:
    """A group's CLUSTER_SPEC with the task's index and node left for task.sh to fill in.
    The shell replaces every occurrence of the two marks, so a job whose own values hold
    one (an output path, say) is refused rather than silently altered."""
    if "__MTC_INDEX__" in cluster_spec or "__MTC_NODE__" in cluster_spec:
        raise ValueError(f"the job's {p.CLUSTER_SPEC} holds __MTC_INDEX__ or __MTC_NODE__, "
                         "which task.sh reserves for the task's index and node")
    doc = json.loads(cluster_spec)
    doc["task"]["index"] = "__MTC_INDEX__"
    doc["task"]["node_id"] = "__MTC_NODE__"
    return json.dumps(doc).replace('"__MTC_INDEX__"', "__MTC_INDEX__")


def slurm_node(name: str | None) -> str:
    """``name`` if it can be a hostfile line (Slurm reads each as a host list), else ValueError."""
    if not name or SLURM_NODE.fullmatch(name) is None:
        raise ValueError(f"invalid Slurm node name {name!r} for the hostfile: "
                         f"must match {SLURM_NODE.pattern}")
    return name


def _fresh_mark(plan: RecoveryPlan | None, node_id: str) -> str:
    """The node's ``MTC_RECOVERY_FRESH`` (``protocol.recovery_env``) in task.sh's case."""
    if plan is None:
        return ""
    return f" {p.RECOVERY_FRESH}={1 if node_id in plan.fresh_node_ids else 0}"
