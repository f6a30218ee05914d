"""What a PyTorch program under mtc (or torchrun, or Vertex) reads from its environment, and
the metrics it writes: TensorBoard scalars continuous across restarts and hypertune reports.

* ``Env.read()``: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``
  (torchrun's and mtc's ``managed_env``), ``AIP_CHECKPOINT_DIR``, ``AIP_MODEL_DIR``,
  ``AIP_TENSORBOARD_LOG_DIR``, ``MTC_JOB_ATTEMPT``, ``CLOUD_ML_TRIAL_ID``; ``init()`` joins
  the process group (gloo on CPU, NCCL when CUDA is there) when the world has several ranks.
* ``Scalars``: rank 0's scalars into ``AIP_TENSORBOARD_LOG_DIR/attempt-<n>/``, as
  ``examples/train.py`` does: an attempt writes only steps above the highest step earlier
  attempts' event files hold, so a resumed run's curve has neither gaps nor repeats.
* ``Hypertune``: when the program is a trial (``CLOUD_ML_TRIAL_ID``), the final metric goes
  through ``cloudml-hypertune`` into the file the tuning service reads.
"""

from __future__ import annotations

import os
import re
import struct
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

ATTEMPT_RE = re.compile(r"^attempt-(\d+)$")


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
        out = output or Path(env.get("MTC_OUTPUT_DIR", "") or "out")
        tb = env.get("AIP_TENSORBOARD_LOG_DIR", "").strip()
        attempt = env.get("MTC_JOB_ATTEMPT", "").strip()
        return Env(
            rank=int(env.get("RANK", "0")), world_size=int(env.get("WORLD_SIZE", "1")),
            local_rank=int(env.get("LOCAL_RANK", env.get("RANK", "0"))),
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=int(env.get("MASTER_PORT", "29500")),
            checkpoint_dir=Path(env.get("AIP_CHECKPOINT_DIR", "").strip() or out / "checkpoints"),
            model_dir=Path(env.get("AIP_MODEL_DIR", "").strip() or out / "model"),
            tensorboard_dir=Path(tb) if tb else None,
            attempt=int(attempt) if attempt.isdigit() else None,
            trial_id=env.get("CLOUD_ML_TRIAL_ID") or None)

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


def last_written_step(root: Path, event_cls: Any) -> int:
    """The highest step of a summary in the event files under ``root/attempt-*/``; a torn
    record at a file's end (a killed writer) ends that file."""
    best = 0
    for path in sorted(root.glob("attempt-*/events.out.tfevents.*")):
        data = path.read_bytes()
        pos = 0
        while pos + 12 <= len(data):  # TFRecord: u64 length, u32 crc, data, u32 crc
            (length,) = struct.unpack_from("<Q", data, pos)
            if (end := pos + 16 + length) > len(data):
                break
            event = event_cls()
            try:
                event.ParseFromString(data[pos + 12 : end - 4])
            except Exception:  # a garbled record: nothing after it is trusted
                break
            best = max(best, int(event.step)) if event.summary.value else best
            pos = end
    return best


class Scalars:
    """TensorBoard scalars of one attempt (rank 0 only; a no-op elsewhere or without a dir)."""

    def __init__(self, root: Path | None, attempt: int | None, enabled: bool = True) -> None:
        self._writer: Any = None
        self._cls: Any = None
        self.written = 0
        if root is None or not enabled:
            return
        try:
            from tensorboardX import SummaryWriter
            from tensorboardX.proto.event_pb2 import Event
        except ImportError as exc:
            print(f"warning: no TensorBoard scalars: {exc}", file=sys.stderr, flush=True)
            return
        self._cls = SummaryWriter
        root.mkdir(parents=True, exist_ok=True)
        if attempt is None:
            seen = [int(m.group(1)) for p in root.iterdir() if (m := ATTEMPT_RE.match(p.name))]
            attempt = max(seen, default=0) + 1
        self.run_dir = root / f"attempt-{attempt}"
        self.written = last_written_step(root, Event)

    def add(self, step: int, values: dict[str, float]) -> None:
        if self._cls is None or step <= self.written:
            return
        if self._writer is None:
            self._writer = self._cls(logdir=str(self.run_dir), flush_secs=5,
                                     filename_suffix=f".from-{step:08d}")
        for tag, value in values.items():
            self._writer.add_scalar(tag, value, global_step=step)
        self.written = step

    def flush(self) -> None:
        """Hand what was added to the OS (before a memory-tier save: a killed process loses
        nothing the save covers; the file stays open)."""
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        """Drain the writer to disk (before a checkpoint, and at exit): no gap on resume."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None


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
