"""Job outputs on a file system of their own, so a job that fills it never fills the state's.

A job that writes until ENOSPC filled the disk the state store lives on, and every tenant's
writes failed with it. When the server runs as root, the output root (``<state>/jobs``) is
an ext4 file system of its own: an image file beside it (sparse: it takes space only as
jobs write), mounted over the output root through a loop device. Its size is a share of
the free space the state's file system has when it is made (``SHARE``), so what jobs can
fill leaves the rest to the state. The image and its mount outlive the server (workers do):
a restart finds it mounted and uses it, a reboot mounts the image again. An output root
that already holds files, or a host without ``mkfs.ext4`` or loop devices, keeps the
outputs where they are, and says so.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from pathlib import Path

log = logging.getLogger(__name__)

SHARE = 0.8  # of the state's free space when the volume is made
MIN_BYTES = 32 << 20
IMAGE_SUFFIX = ".img"


def image_of(root: Path) -> Path:
    return root.with_name(root.name + IMAGE_SUFFIX)


def ensure(root: Path, size_bytes: int | None = None) -> str:
    """``root`` on its own file system: "mounted" (now), "mounted already", or why not."""
    root = root.absolute()
    if os.path.ismount(root):
        return "mounted already"
    if os.geteuid() != 0:
        return "not root: a loop device needs root"
    if root.is_dir() and any(p.name != "lost+found" for p in root.iterdir()):
        return f"{root} holds files already: they stay on the state's file system"
    mkfs, mount = shutil.which("mkfs.ext4"), shutil.which("mount")
    if mkfs is None or mount is None:
        return "no mkfs.ext4 or mount on this host"
    image = image_of(root)
    try:
        root.mkdir(parents=True, exist_ok=True)
        if not image.exists():
            free = shutil.disk_usage(root.parent).free
            size = max(MIN_BYTES, size_bytes or int(free * SHARE))
            with open(image, "wb") as f:
                os.fchmod(f.fileno(), 0o600)
                f.truncate(size)  # sparse: blocks are taken as jobs write
            _run([mkfs, "-q", "-F", "-m", "0", "-E", "root_owner=0:0", str(image)])
        _run([mount, "-o", "loop,nosuid,nodev", str(image), str(root)])
    except (OSError, subprocess.SubprocessError) as exc:
        return f"could not mount {image}: {exc}"
    os.chmod(root, 0o755)
    log.info("job outputs on their own file system: %s mounted at %s", image, root)
    return "mounted"


def _run(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        raise subprocess.SubprocessError(f"{argv[0]}: {(done.stderr or done.stdout).strip()}")
