"""Run several processes on one node with ``torch.distributed.run`` and keep the worker protocol.

    python torch_node.py --nproc-per-node P -- CMD [ARG...]          (one per node)
    python torch_node.py child --exit-dir DIR -- CMD [ARG...]        (torchrun starts these)

A pool that asks for several processes per replica (docs/pytorch.md) runs this as its
command under ``worker_launcher``, one per node. It reads the node's place from the managed
environment (``RANK``: the node's rank, ``WORLD_SIZE``: the number of nodes, ``MASTER_ADDR``,
``MASTER_PORT``) and starts ``python -m torch.distributed.run`` with a static rendezvous
(``--nnodes``, ``--node-rank``, ``--master-addr``, ``--master-port``, ``--nproc-per-node``,
``--max-restarts 0``: mtc restarts the gang, torchrun restarts nothing). torchrun then gives
each process ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``.

The worker protocol survives torchrun, which exits 1 whatever ended its workers:

* each process runs under ``child``, which records its exit code in ``DIR/local-<LOCAL_RANK>``
  (``worker_launcher.run``), so the node's code is that of its processes: the earliest code
  other than 0 and 75 (a killed process: 137), else 75 if one checkpointed on SIGTERM, else 0;
  torchrun's own code only when no process left one;
* SIGTERM: torchrun runs in its own session and gets the signal once, from here; it sends
  SIGTERM to every process and SIGKILLs them 30 s later. A process that fails ends the
  others on the node (torchrun), and the node's non-zero code ends the gang (the adapter);
* no orphans: torchrun and each ``child`` die with their parent (``PR_SET_PDEATHSIG``).

Standard library only, run by file path with the runtime's Python (the one that has torch).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import FrameType, ModuleType

PREEMPTED = 75  # the worker protocol's (mtc_program.protocol), restated: run by path
LAUNCHER_PATH = Path(__file__).parents[1] / "adapters" / "compute" / "worker_launcher.py"


def _launcher() -> ModuleType:
    """``worker_launcher``, loaded by path: this file runs without the mtc package."""
    spec = importlib.util.spec_from_file_location("mtc_worker_launcher", LAUNCHER_PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def node_code(codes: Sequence[tuple[float, int]], torchrun_code: int, nproc: int) -> int:
    """The node's exit code from its processes' ``(time, code)`` (see the module)."""
    failed = sorted((t, c) for t, c in codes if c not in (0, PREEMPTED))
    if failed:
        return failed[0][1]
    if any(c == PREEMPTED for _, c in codes):
        return PREEMPTED
    if len(codes) == nproc:
        return 0  # every process finished: what torchrun said after that is not theirs
    return torchrun_code or 1  # a process left no code: torchrun's says what happened


def read_codes(exit_dir: Path) -> list[tuple[float, int]]:
    out = []
    for path in exit_dir.glob("local-*.exit"):
        with contextlib.suppress(OSError, ValueError):
            out.append((path.stat().st_mtime, int(path.read_text().strip())))
    return out


def torchrun_argv(nproc: int, exit_dir: Path, command: Sequence[str],
                  env: dict[str, str]) -> list[str]:
    """``torch.distributed.run`` for this node, its processes wrapped in ``child``."""
    def need(name: str) -> str:
        value = env.get(name, "")
        if not value:
            raise SystemExit(f"torch_node: {name} is not set (the managed environment gives it)")
        return value

    return [sys.executable, "-m", "torch.distributed.run",
            "--nnodes", need("WORLD_SIZE"), "--node-rank", need("RANK"),
            "--master-addr", need("MASTER_ADDR"), "--master-port", need("MASTER_PORT"),
            "--nproc-per-node", str(nproc), "--max-restarts", "0", "--no-python",
            sys.executable, str(Path(__file__).absolute()), "child", "--exit-dir", str(exit_dir),
            "--", *command]


def run_node(nproc: int, command: Sequence[str]) -> int:
    wl = _launcher()
    exit_dir = Path(tempfile.mkdtemp(prefix="mtc-torch-node-"))
    proc: subprocess.Popen[bytes] | None = None
    pending: list[int] = []

    def relay(signum: int, frame: FrameType | None) -> None:
        if proc is None:
            pending.append(signum)
        elif proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, relay)
    try:
        argv = torchrun_argv(nproc, exit_dir, command, dict(os.environ))
        proc = subprocess.Popen(argv, start_new_session=True, preexec_fn=wl._pdeathsig_hook())
        for signum in pending[:1]:
            proc.send_signal(signum)
        torchrun_code = wl.exit_code_of(proc.wait())
        code = node_code(read_codes(exit_dir), torchrun_code, nproc)
        print(f"torch_node: {nproc} processes ended, node exit code {code} "
              f"(torchrun {torchrun_code})", file=sys.stderr, flush=True)
        return code
    finally:
        shutil.rmtree(exit_dir, ignore_errors=True)


def _die_with_parent() -> None:
    """``PR_SET_PDEATHSIG`` = SIGKILL on this process (Linux): torchrun's death takes it."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent:  # torchrun died before the call took effect
        os.kill(os.getpid(), signal.SIGKILL)


def run_child(exit_dir: str, command: Sequence[str]) -> int:
    """One process under torchrun: dies with torchrun, leaves its code for ``run_node``."""
    wl = _launcher()
    _die_with_parent()
    local = os.environ.get("LOCAL_RANK", "0")
    return int(wl.run(str(Path(exit_dir) / f"local-{local}.exit"), command))


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    split = args.index("--") if "--" in args else len(args)
    opts, command = args[:split], args[split + 1:]
    if not command:
        raise SystemExit("torch_node: no command given after --")
    if opts[:1] == ["child"]:
        parser = argparse.ArgumentParser(prog="torch_node child")
        parser.add_argument("--exit-dir", required=True)
        return run_child(parser.parse_args(opts[1:]).exit_dir, command)
    parser = argparse.ArgumentParser(prog="torch_node")
    parser.add_argument("--nproc-per-node", type=int, required=True)
    nproc = parser.parse_args(opts).nproc_per_node
    if nproc < 1:
        raise SystemExit("torch_node: --nproc-per-node must be at least 1")
    return run_node(nproc, command)


if __name__ == "__main__":
    sys.exit(main())
