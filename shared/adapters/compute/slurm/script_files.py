"""Writing the Slurm adapter's scripts: a file replaced whole, a comment line made safe."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["comment", "write_executable"]


def comment(text: str) -> str:
    """``text`` made safe for a ``#`` comment line: printable ASCII only, one line."""
    return "".join(c if " " <= c <= "~" else "?" for c in text)


def write_executable(path: Path, text: str, mode: int = 0o755) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.chmod(mode)
    os.replace(tmp, path)
