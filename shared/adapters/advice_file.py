"""The control plane's advice to a job's program, as an environment file beside its
checkpoints: ``$AIP_CHECKPOINT_DIR/../mtc-advice.env`` (``MTC_ADVICE_FILE`` in the workers'
environment names it).

One ``KEY=value`` line per setting (shell- and dotenv-readable, values never need quoting:
numbers and words), replaced atomically (a temporary file, then a rename), so a program that
re-reads it between steps sees the old or the new advice, never half of one. Only paths under
the configured output root are written (``ControlPlaneConfig.output_root``: the job outputs
the control plane itself lays out); anything else (``gs://`` on GCP, the twin's ``sim://``) is
left alone: there the advice is in the job view only.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path

from mtc_program.protocol import ADVICE_NAME

__all__ = ["ADVICE_FILE", "FileAdviceSink", "advice_path"]

ADVICE_FILE = ADVICE_NAME
_KEY = re.compile(r"^[A-Z][A-Z0-9_]*$")
_VALUE = re.compile(r"^[A-Za-z0-9_.+-]*$")


def advice_path(checkpoint_dir: str | Path) -> Path:
    """Where the advice for the job checkpointing into ``checkpoint_dir`` is written."""
    return Path(checkpoint_dir).parent / ADVICE_FILE


class FileAdviceSink:
    def __init__(self, root: Path) -> None:
        self.root = Path(root).resolve()

    def publish(self, checkpoint_path: str, job_id: str, env: Mapping[str, str]) -> None:
        path = advice_path(Path(checkpoint_path).parent)
        try:
            target = path.resolve()
        except OSError:
            return
        if not target.is_relative_to(self.root) or not target.parent.is_dir():
            return
        lines = [f"# mtc checkpoint advice for job {job_id}"]
        for key, value in sorted(env.items()):
            if not _KEY.match(key) or not _VALUE.match(value):
                raise ValueError(f"advice {key}={value!r}: not a plain KEY=value")
            lines.append(f"{key}={value}")
        fd, tmp = tempfile.mkstemp(prefix=".mtc-advice.", dir=target.parent)
        try:
            os.fchmod(fd, 0o644)  # the job reads it: a sandboxed job runs as another user
            with os.fdopen(fd, "w") as fh:
                fh.write("\n".join(lines) + "\n")
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
