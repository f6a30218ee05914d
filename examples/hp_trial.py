"""A hyperparameter-tuning trial: heavy-ball SGD on a fixed ill-conditioned quadratic.

The tuning service runs it once per trial with the trial's hyperparameters as arguments
(``--learning_rate=0.05 --momentum=0.9``) and reads what it reports through the unmodified
``cloudml-hypertune`` package (``CLOUD_ML_HP_METRIC_FILE``, ``CLOUD_ML_TRIAL_ID``). The metric,
``loss`` (minimize), is the objective after ``--steps`` steps: it really depends on both
hyperparameters (too small a rate crawls, too large diverges; momentum helps up to a point),
and it is deterministic, so an interrupted and resumed trial reports exactly what an
uninterrupted one would.

Like ``examples/train.py`` it behaves like a managed job: checkpoints (``ckpt-<step:08d>.npz``,
atomic) in ``AIP_CHECKPOINT_DIR`` every ``--checkpoint-every`` steps; on SIGTERM it saves one and
exits 75; on start it resumes from the newest checkpoint that loads and logs ``resumed from
step N``. At the end it writes ``AIP_MODEL_DIR/result.json``: the final loss, the parameters,
and the steps it resumed from (one entry per start). A ``gs://BUCKET/...`` directory (Vertex's,
and mtc's where the job's sandbox mounts the bucket) is written at ``/gcs/BUCKET/...``.
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import contextlib  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import re  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from types import FrameType  # noqa: E402
from typing import Any  # noqa: E402

import hypertune  # noqa: E402
import numpy as np  # noqa: E402

EXIT_OK, EXIT_CONFIG, EXIT_PREEMPTED = 0, 2, 75
CHECKPOINT_RE = re.compile(r"^ckpt-(\d{8,})\.npz$")
CURVATURE = np.logspace(-1.0, 1.0, 10)  # the quadratic's eigenvalues: condition number 100
LOSS_CAP = 1e12  # a diverged run reports this instead of inf


def _local(value: str) -> str:
    """A job directory as a file path: Vertex (and mtc's sandbox) name it ``gs://BUCKET/...``
    and mount Cloud Storage at ``/gcs/`` (Cloud Storage FUSE); a local path is itself."""
    return "/gcs/" + value[len("gs://"):] if value.startswith("gs://") else value


def loss(w: np.ndarray) -> float:
    value = float(0.5 * np.sum(CURVATURE * w * w))
    return value if math.isfinite(value) and value < LOSS_CAP else LOSS_CAP


def step(w: np.ndarray, v: np.ndarray, lr: float, momentum: float) -> None:
    with np.errstate(over="ignore", invalid="ignore"):
        v *= momentum
        v -= lr * CURVATURE * w
        w += v
        np.nan_to_num(w, copy=False, nan=1e6, posinf=1e6, neginf=-1e6)
        np.clip(w, -1e6, 1e6, out=w)


def atomic_write(path: Path, write: Any) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def save(directory: Path, n: int, w: np.ndarray, v: np.ndarray, config: dict[str, float]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"ckpt-{n:08d}.npz"
    atomic_write(path, lambda f: np.savez(f, step=np.array(n), w=w, v=v,
                                          config=np.array(json.dumps(config, sort_keys=True))))
    return path


def resume(directory: Path, config: dict[str, float]) -> tuple[int, np.ndarray, np.ndarray] | None:
    """The newest checkpoint that loads and was written for these hyperparameters."""
    if not directory.is_dir():
        return None
    found = sorted(((int(m.group(1)), p) for p in directory.iterdir()
                    if (m := CHECKPOINT_RE.match(p.name))), reverse=True)
    for n, path in found:
        try:
            with np.load(path, allow_pickle=False) as z:
                if json.loads(str(z["config"])) != config or int(z["step"]) != n:
                    continue
                return n, np.array(z["w"], dtype=float), np.array(z["v"], dtype=float)
        except Exception as exc:  # a broken file: try the next
            print(f"skipping checkpoint {path.name}: {exc}", flush=True)
    return None


class Preemption:
    def __init__(self) -> None:
        self.signum: int | None = None
        signal.signal(signal.SIGTERM, self._handle)
        signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.signum = signum

    def sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while self.signum is None and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, 0.02))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--learning_rate", type=float, required=True)
    p.add_argument("--momentum", type=float, default=0.0)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--step-time", type=float, default=0.0, help="seconds to sleep per step")
    p.add_argument("--checkpoint-every", type=int, default=5)
    p.add_argument("--report-every", type=int, default=5)
    args = p.parse_args(argv)
    if not (args.learning_rate > 0 and 0 <= args.momentum < 1 and args.steps > 0
            and args.checkpoint_every > 0 and args.report_every > 0 and args.step_time >= 0):
        p.error("need --learning_rate > 0, 0 <= --momentum < 1, positive --steps, "
                "--checkpoint-every, --report-every and --step-time >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    preemption = Preemption()
    args = parse_args(argv)
    out = Path(os.environ.get("MTC_TRAIN_OUTPUT", "hp-trial-output"))
    ckpt_dir = Path(_local(os.environ.get("AIP_CHECKPOINT_DIR", "").strip()) or out / "checkpoints")
    model_dir = Path(_local(os.environ.get("AIP_MODEL_DIR", "").strip()) or out / "model")
    trial = os.environ.get("CLOUD_ML_TRIAL_ID", "0")
    config = {"learning_rate": args.learning_rate, "momentum": args.momentum}
    tuner = hypertune.HyperTune()
    found = resume(ckpt_dir, config)
    starts_file = ckpt_dir / "starts.json"
    starts: list[int] = json.loads(starts_file.read_text()) if starts_file.is_file() else []
    if found is None:
        n, w, v = 0, np.ones_like(CURVATURE), np.zeros_like(CURVATURE)
        print(f"[trial {trial}] no checkpoint found: starting from step 0", flush=True)
    else:
        n, w, v = found
        print(f"[trial {trial}] resumed from step {n}", flush=True)
    starts.append(n)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(starts_file, lambda f: f.write(json.dumps(starts).encode()))
    saved = n
    while n < args.steps:
        step(w, v, args.learning_rate, args.momentum)
        n += 1
        if n % args.report_every == 0 or n == args.steps:
            tuner.report_hyperparameter_tuning_metric(
                hyperparameter_metric_tag="loss", metric_value=loss(w), global_step=n)
        if n % args.checkpoint_every == 0:
            save(ckpt_dir, n, w, v, config)
            saved = n
        preemption.sleep(args.step_time)
        if preemption.signum is not None and n < args.steps:
            if saved != n:
                save(ckpt_dir, n, w, v, config)
            print(f"[trial {trial}] preempted at step {n}, exiting {EXIT_PREEMPTED}", flush=True)
            return EXIT_PREEMPTED
    if saved != n:
        save(ckpt_dir, n, w, v, config)
    model_dir.mkdir(parents=True, exist_ok=True)
    result = {"loss": loss(w), **config, "steps": n, "resumed_from": starts}
    atomic_write(model_dir / "result.json", lambda f: f.write(json.dumps(result).encode()))
    print(f"[trial {trial}] done: loss {loss(w):.6g}", flush=True)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
