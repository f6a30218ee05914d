"""Fixtures for the tests against the real Pub/Sub and Firestore emulators.

The session starts the emulators with ``scripts/emulators.sh`` (free 127.0.0.1 ports, PIDs
recorded under a temporary folder) and stops exactly those at the end. If the environment
already points at running emulators (``.ci/run`` may start them), those are used and left
alone. A machine without the emulators skips these tests, saying why.
"""

from __future__ import annotations

import os
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from gcp_support import PROJECT, ROOT

SCRIPT = ROOT / "scripts" / "emulators.sh"


def _answers(host: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{host}/", timeout=1) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def _read_env(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        if line.startswith("export "):
            key, _, value = line[len("export ") :].partition("=")
            out[key] = value
    return out


@pytest.fixture(scope="session")
def emulators(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    hosts = {k: os.environ.get(k, "") for k in ("PUBSUB_EMULATOR_HOST", "FIRESTORE_EMULATOR_HOST")}
    mp = pytest.MonkeyPatch()
    if all(hosts.values()) and all(_answers(h) for h in hosts.values()):
        mp.setenv("GOOGLE_CLOUD_PROJECT", PROJECT)
        yield hosts
        mp.undo()
        return
    state = tmp_path_factory.mktemp("emulators")
    env = {**os.environ, "MTC_EMULATORS_DIR": str(state), "GOOGLE_CLOUD_PROJECT": PROJECT}
    check = subprocess.run([str(SCRIPT), "check"], capture_output=True, text=True, env=env)
    if check.returncode != 0:
        pytest.skip(
            "Pub/Sub and Firestore emulators are not installed on this machine "
            f"(scripts/emulators.sh check): {check.stderr.strip()}"
        )
    start = subprocess.run([str(SCRIPT), "start"], capture_output=True, text=True, env=env, timeout=120)
    if start.returncode != 0:
        subprocess.run([str(SCRIPT), "stop"], env=env, capture_output=True, timeout=60)
        pytest.fail(f"emulators did not start:\n{start.stdout}\n{start.stderr}")
    values = _read_env(state / "emulators.env")
    for key, value in values.items():
        mp.setenv(key, value)
    mp.setenv("GOOGLE_CLOUD_PROJECT", PROJECT)
    try:
        yield values
    finally:
        mp.undo()
        subprocess.run([str(SCRIPT), "stop"], env=env, capture_output=True, timeout=60)
