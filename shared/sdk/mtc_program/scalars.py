"""TensorBoard scalars continuous across restarts (standard library; ``tensorboardX`` when
it is installed, else a warning and nothing written).

Rank 0 writes one run per attempt, ``AIP_TENSORBOARD_LOG_DIR/attempt-<n>/`` (``n``:
``MTC_JOB_ATTEMPT``, else the next free). An attempt writes only steps above the highest step
earlier attempts' event files hold, so steps recomputed after a resume never appear twice;
close the writer before each checkpoint (``close``), so the files reach the saved step and a
resume leaves no gap. TensorBoard then draws one curve, steps 1..N.
"""

from __future__ import annotations

import re
import struct
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ATTEMPT_RE = re.compile(r"^attempt-(\d+)$")


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


def import_tensorboardx() -> tuple[Any, Any]:
    """tensorboardX's writer and event classes, without importing torch: tensorboardX imports
    torch when it is installed (only to accept tensors), which costs a numpy program seconds
    of its start. ``sys.modules["torch"] = None`` makes its guarded ``import torch`` fail
    fast; the entry is put back as it was, so a later ``import torch`` still works (a torch
    program, which has imported torch already, is unaffected)."""
    had = "torch" in sys.modules
    saved = sys.modules.get("torch")
    if not had:
        sys.modules["torch"] = None  # type: ignore[assignment]
    try:
        from tensorboardX import SummaryWriter
        from tensorboardX.proto.event_pb2 import Event
    finally:
        if not had:
            sys.modules.pop("torch", None)
        elif saved is not None:
            sys.modules["torch"] = saved
    return SummaryWriter, Event


class Scalars:
    """One attempt's scalars (see the module). A no-op without a directory, when not
    ``enabled`` (ranks other than 0) or without tensorboardX. ``live``: flush after every
    ``add``, so TensorBoard shows the run as it goes (a writer thread's cost per step)."""

    def __init__(self, root: Path | None, attempt: int | None,
                 log: Callable[[str], None] | None = None, *, enabled: bool = True,
                 live: bool = False) -> None:
        self._writer: Any = None
        self._cls: Any = None
        self.live = live
        self.written = 0
        if root is None or not enabled:
            return
        try:
            writer_cls, event_cls = import_tensorboardx()
        except ImportError as exc:
            print(f"warning: no TensorBoard scalars: {exc}", file=sys.stderr, flush=True)
            return
        self._cls = writer_cls
        root.mkdir(parents=True, exist_ok=True)
        if attempt is None:
            seen = [int(m.group(1)) for d in root.iterdir() if (m := ATTEMPT_RE.match(d.name))]
            attempt = max(seen, default=0) + 1
        self.run_dir = root / f"attempt-{attempt}"
        self.written = last_written_step(root, event_cls)
        if self.written and log is not None:
            log(f"tensorboard: {self.run_dir} gets steps after {self.written}")

    def add(self, step: int, values: dict[str, float]) -> None:
        if self._cls is None or step <= self.written:
            return
        if self._writer is None:  # one event file per stretch between checkpoints
            self._writer = self._cls(logdir=str(self.run_dir), flush_secs=5,
                                     filename_suffix=f".from-{step:08d}")
        for tag, value in values.items():
            self._writer.add_scalar(tag, value, global_step=step)
        if self.live:
            self._writer.flush()
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
