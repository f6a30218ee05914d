"""What mtc's managed environment costs a PyTorch job, and what its checkpoints cost.

    PYTHONPATH=. python bench/torch_bench.py [--rounds 3] [--steps 150] [--world 2]
                                             [--sizes 1,8,32] [--json]

* **Throughput**: the tiny ``pretrain`` recipe (``services.recipes.programs.lm``, data
  parallel over gloo, ``--world`` ranks) launched the way mtc's local compute launches a gang (each rank under
  ``worker_launcher`` in its own session, output to a log file, the environment
  ``{**os.environ, **managed_env(spec)}``) against the same program under plain ``torchrun``
  (``python -m torch.distributed.run --nproc-per-node``), interleaved A B B A in the same
  sitting. Tokens per second is what the program measures over its training loop (all ranks'
  tokens over the loop's wall time); the ratio is the medians' (mtc / torchrun). Both arms
  write the same checkpoints (every 50 steps) to a temp directory.
* **Checkpoints**: ``Checkpointer.save`` and ``restore`` (torch.distributed.checkpoint, one
  process) of a stack of linear layers with AdamW state, per size in millions of parameters;
  the state on disk is ~3x the parameters (weights and Adam's two moments, float32).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mtc_program import protocol  # noqa: E402
from services.recipes.catalog import PROGRAM, program_config, program_pythonpath, resolve  # noqa: E402
from shared.adapters.compute.local.procs import spawn_launcher  # noqa: E402
from shared.adapters.compute.protocol import managed_env  # noqa: E402
from shared.ports import WorkerSpec  # noqa: E402


def config(steps: int) -> dict[str, Any]:
    return program_config(resolve("pretrain", ["size=tiny", f"hyperparameters.steps={steps}",
                                               "checkpoint.every=50"]))


def _metrics(out: Path) -> dict[str, Any]:
    return json.loads((out / "model" / "metrics.json").read_text())  # type: ignore[no-any-return]


def run_mtc(cfg: dict[str, Any], world: int, out: Path, n: int) -> dict[str, Any]:
    """The gang as LocalCompute starts it: launcher per rank, managed_env, logs to files."""
    command = (sys.executable, "-m", PROGRAM, "--config", json.dumps(cfg))
    started = time.perf_counter()
    pids = []
    for rank in range(world):
        spec = WorkerSpec(job_id=f"bench-{n}", attempt=1, rank=rank, world_size=world,
                          node_id=f"node-{rank}", command=command,
                          env=(("PYTHONPATH", program_pythonpath()),),
                          checkpoint_dir=str(out / "checkpoints"), model_dir=str(out / "model"),
                          tensorboard_dir=str(out / "tb"))
        env = {**os.environ, **managed_env(spec)}
        pids.append(spawn_launcher(sys.executable, out / f"exit-{rank}", command, env,
                                   out / f"rank-{rank}.log"))
    codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]
    if any(codes):
        raise RuntimeError(f"mtc arm failed {codes}: {(out / 'rank-0.log').read_text()[-2000:]}")
    return {**_metrics(out), "wall_s": time.perf_counter() - started}


def run_torchrun(cfg: dict[str, Any], world: int, out: Path) -> dict[str, Any]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": program_pythonpath(),
           protocol.CHECKPOINT_DIR: str(out / "checkpoints"), protocol.MODEL_DIR: str(out / "model"),
           protocol.TENSORBOARD_LOG_DIR: str(out / "tb")}
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={world}",
         "--master-addr=127.0.0.1", f"--master-port={port}", "-m", PROGRAM,
         "--config", json.dumps(cfg)], env=env, cwd=out, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"torchrun arm failed: {proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return {**_metrics(out), "wall_s": time.perf_counter() - started}


def throughput(rounds: int, steps: int, world: int) -> dict[str, Any]:
    cfg = config(steps)
    arms: dict[str, list[dict[str, Any]]] = {"mtc": [], "torchrun": []}
    n = 0
    for r in range(rounds):
        order = ("mtc", "torchrun") if r % 2 == 0 else ("torchrun", "mtc")
        for arm in order:
            out = Path(tempfile.mkdtemp(prefix=f"torch-bench-{arm}-"))
            try:
                n += 1
                result = run_mtc(cfg, world, out, n) if arm == "mtc" else run_torchrun(
                    cfg, world, out)
            finally:
                shutil.rmtree(out, ignore_errors=True)
            arms[arm].append(result)
            print(f"round {r + 1} {arm:8s} {result['tokens_per_s']:9.0f} tokens/s "
                  f"(wall {result['wall_s']:.1f}s)", file=sys.stderr, flush=True)
    med = {a: statistics.median(x["tokens_per_s"] for x in runs) for a, runs in arms.items()}
    return {"steps": steps, "world": world, "rounds": rounds,
            "tokens_per_s": {a: [round(x["tokens_per_s"], 1) for x in runs]
                             for a, runs in arms.items()},
            "median_tokens_per_s": {a: round(v, 1) for a, v in med.items()},
            "ratio_mtc_over_torchrun": round(med["mtc"] / med["torchrun"], 4),
            "wall_s": {a: [round(x["wall_s"], 2) for x in runs] for a, runs in arms.items()},
            "final_loss_equal": len({x["final_loss"] for runs in arms.values() for x in runs}) == 1}


def checkpoint_costs(sizes_m: list[float], repeats: int = 3) -> list[dict[str, Any]]:
    import torch

    from mtc_program.torch_checkpoint import Checkpointer

    rows = []
    for size in sizes_m:
        width = 1024
        layers = max(1, round(size * 1e6 / (width * width + width)))
        model = torch.nn.Sequential(*(torch.nn.Linear(width, width) for _ in range(layers)))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        model(torch.randn(2, width)).sum().backward()
        opt.step()
        params = sum(p.numel() for p in model.parameters())
        saves, loads = [], []
        for i in range(repeats):
            d = Path(tempfile.mkdtemp(prefix="torch-bench-ckpt-"))
            try:
                ck = Checkpointer(d, model, opt, log=lambda _m: None)
                t = time.perf_counter()
                ck.save(i + 1)
                saves.append(time.perf_counter() - t)
                nbytes = sum(f.stat().st_size for f in (d / protocol.checkpoint_name(i + 1)).iterdir())
                t = time.perf_counter()
                Checkpointer(d, model, opt, log=lambda _m: None).restore()
                loads.append(time.perf_counter() - t)
            finally:
                shutil.rmtree(d, ignore_errors=True)
        rows.append({"parameters_m": round(params / 1e6, 2), "bytes_mb": round(nbytes / 1e6, 1),
                     "save_s": round(statistics.median(saves), 3),
                     "restore_s": round(statistics.median(loads), 3)})
        print(f"checkpoint {params / 1e6:6.1f}M params {nbytes / 1e6:7.1f} MB: save "
              f"{rows[-1]['save_s']}s restore {rows[-1]['restore_s']}s", file=sys.stderr)
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--sizes", default="1,8,32", help="checkpoint sizes, millions of parameters")
    p.add_argument("--skip-throughput", action="store_true")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    report: dict[str, Any] = {"cpus": os.cpu_count(),
                              "load_avg_before": os.getloadavg()[0]}
    if not args.skip_throughput:
        report["throughput"] = throughput(args.rounds, args.steps, args.world)
    report["checkpoints"] = checkpoint_costs([float(s) for s in args.sizes.split(",") if s])
    report["load_avg_after"] = os.getloadavg()[0]
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
