"""State files only their owner reads: the state database and the compute ledgers hold every
job's environment values and the audit log, so they are 0600 in a 0700 directory, whatever
the process's umask (sqlite creates its -wal and -shm files with the database's mode)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

DIR_MODE = 0o700
FILE_MODE = 0o600


def private_dir(path: Path) -> Path:
    """``path`` created (with its parents) and closed to group and others."""
    path.mkdir(parents=True, exist_ok=True)
    _tighten(path, DIR_MODE)
    return path


def private_file(path: Path) -> Path:
    """``path`` created empty if absent, 0600 either way; its directory is left as it is."""
    fd = os.open(path, os.O_CREAT | os.O_RDWR, FILE_MODE)
    os.close(fd)
    _tighten(path, FILE_MODE)
    for suffix in ("-wal", "-shm", "-journal"):  # a database's companions, where present
        companion = path.with_name(path.name + suffix)
        if companion.exists():
            _tighten(companion, FILE_MODE)
    return path


def _tighten(path: Path, mode: int) -> None:
    current = stat.S_IMODE(path.stat().st_mode)
    if current & ~mode:
        os.chmod(path, current & mode)
