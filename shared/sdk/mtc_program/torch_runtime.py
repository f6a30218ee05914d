"""What a PyTorch program under mtc (or torchrun, or Vertex) reads from its environment, and
the metric it reports (the ``torch`` extra).

* ``Env.read()``: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``
  (torchrun's and mtc's), ``AIP_CHECKPOINT_DIR``, ``AIP_MODEL_DIR``,
  ``AIP_TENSORBOARD_LOG_DIR`` (a ``gs://`` one as its ``/gcs/`` path, ``protocol.local_path``),
  ``MTC_JOB_ATTEMPT``, ``CLOUD_ML_TRIAL_ID``; ``init()`` joins
  the process group (gloo on CPU, NCCL when CUDA is there) when the world has several ranks.
* ``Hypertune``: when the program is a trial (``CLOUD_ML_TRIAL_ID``), the final metric goes
  through ``cloudml-hypertune`` into the file the tuning service reads.
* ``exit_now``: the exit a ``torch.distributed`` rank needs.

TensorBoard scalars continuous across restarts are ``mtc_program.scalars``.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from mtc_program import protocol as p


@dataclass(frozen=True)
class Env:
    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    checkpoint_dir: Path
    model_dir: Path
    tensorboard_dir: Path | None
    attempt: int | None
    trial_id: str | None

    @staticmethod
    def read(environ: dict[str, str] | None = None, output: Path | None = None) -> Env:
        env = dict(os.environ if environ is None else environ)
        out = output or Path(env.get("MTC_OUTPUT_DIR", "") or "out")  # run by hand
        ckpt, model, tb = (p.local_path(env.get(n, "").strip()) for n in p.JOB_DIRS)
        attempt = env.get(p.JOB_ATTEMPT, "").strip()
        return Env(
            rank=int(env.get(p.RANK, "0")), world_size=int(env.get(p.WORLD_SIZE, "1")),
            local_rank=int(env.get(p.LOCAL_RANK, env.get(p.RANK, "0"))),
            master_addr=env.get(p.MASTER_ADDR, "127.0.0.1"),
            master_port=int(env.get(p.MASTER_PORT, "29500")),
            checkpoint_dir=Path(ckpt or out / "checkpoints"),
            model_dir=Path(model or out / "model"),
            tensorboard_dir=Path(tb) if tb else None,
            attempt=int(attempt) if attempt.isdigit() else None,
            trial_id=env.get(p.TRIAL_ID) or None)

    def init(self) -> bool:
        """Join the process group when there are several ranks; whether it did."""
        if self.world_size <= 1 or dist.is_initialized():
            return dist.is_initialized()
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(self.local_rank)
        dist.init_process_group(backend, init_method=f"tcp://{self.master_addr}:{self.master_port}",
                                rank=self.rank, world_size=self.world_size)
        return True


    def device(self) -> torch.device:
        """This rank's GPU where there is one (the group is NCCL's then), else the CPU."""
        if torch.cuda.is_available():
            return torch.device("cuda", self.local_rank % torch.cuda.device_count())
        return torch.device("cpu")


class Hypertune:
    """Reports the metric when the program is a trial of a HyperparameterTuningJob."""

    def __init__(self, trial_id: str | None, tag: str) -> None:
        self.tag = tag
        self._tuner: Any = None
        if trial_id is None:
            return
        try:
            import hypertune
        except ImportError as exc:
            print(f"warning: trial {trial_id} reports nothing: {exc}", file=sys.stderr, flush=True)
            return
        self._tuner = hypertune.HyperTune()

    def report(self, value: float, step: int) -> None:
        if self._tuner is not None:
            self._tuner.report_hyperparameter_tuning_metric(
                hyperparameter_metric_tag=self.tag, metric_value=float(value), global_step=step)


def exit_now(code: int) -> None:
    """End the process with ``code`` once everything is written: stdio flushed, then
    ``os._exit``. A rank that has destroyed its process group can still wait in a futex at
    interpreter exit for minutes (gloo's teardown on CPU; seen on Slurm and locally), which
    holds its gang open and eats the grace period. Everything the program must write (model,
    checkpoints, TensorBoard) is closed before this is called."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
