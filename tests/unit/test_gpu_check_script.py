"""``scripts/gpu_check.sh`` (``make gpu-check``) where there is no GPU: it says so and exits
0, without nvidia-smi on the PATH and with one that lists no device (the GPU half itself
needs a GPU machine: docs/gpu.md)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.sh"


def run(path: Path) -> subprocess.CompletedProcess[str]:
    bash = shutil.which("bash")
    assert bash is not None
    return subprocess.run([bash, str(SCRIPT)], env={"PATH": str(path)}, capture_output=True,
                          text=True, timeout=30)


def test_no_nvidia_smi_on_the_path_skips(tmp_path: Path) -> None:
    done = run(tmp_path)  # an empty directory: no nvidia-smi, nor anything else
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("no GPU: skipped"), done.stdout


def test_an_nvidia_smi_that_lists_no_device_skips(tmp_path: Path) -> None:
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'No devices were found'\nexit 6\n")
    fake.chmod(0o755)
    done = run(tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "no GPU: skipped (nvidia-smi lists no device)", done.stdout
