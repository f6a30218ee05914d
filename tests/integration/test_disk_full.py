"""A full disk under the state is a condition, not a crash. A write the
storage refuses is a 503 naming the state directory with nothing half-written, reads keep
answering, the control loop keeps running (and /readyz says why it is not ready), and the
same call succeeds once space returns. The state lives on a real 4 MiB tmpfs (root mounts it,
as CI runs; skipped where mounting is not allowed)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.api.http import create_app
from services.wiring.api import embedded_api
from services.wiring.control_loop import ControlLoop, LoopRuntime, readiness
from services.wiring.embedded import embedded
from tests.serving import PARENT, cluster_body
from tests.unit.api.conftest import AUTH, TOKEN, one_pass_config

SIZE = "16m"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SIZE}", "tmpfs", str(mount)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill(mount: Path) -> Path:
    """Fill the file system to the last block; the returned file frees it again."""
    ballast = mount / "ballast"
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for chunk in (1 << 16, 512, 1):
            try:
                while True:
                    os.write(fd, b"\0" * chunk)
            except OSError:
                pass
    finally:
        os.close(fd)
    return ballast


def test_defect_1_a_full_disk_is_a_503_naming_the_state_and_nothing_is_lost(
        small_disk: Path) -> None:
    state = small_disk / "state"
    app = embedded(state, config=one_pass_config())
    loop = ControlLoop(app).start()
    ctx, _ = embedded_api(app, env_token=TOKEN, runtime=LoopRuntime(loop))
    client = create_app(ctx).test_client()
    clusters = f"/v1beta1/{PARENT}/modelDevelopmentClusters"
    try:
        first = client.post(f"{clusters}?modelDevelopmentClusterId=c1",
                            json=cluster_body(workers=1), headers=AUTH)
        assert first.status_code == 200, first.json
        ballast = _fill(small_disk)
        refused = [client.post(f"{clusters}?modelDevelopmentClusterId=c{i}",
                               json=cluster_body(workers=1), headers=AUTH) for i in (2, 3)]
        statuses = [r.status_code for r in refused]
        assert 503 in statuses, [r.json for r in refused]
        full = next(r for r in refused if r.status_code == 503)
        assert str(state) in full.json["error"]["message"], full.json
        assert full.headers.get("Retry-After")
        listed = client.get(clusters, headers=AUTH)  # reads still answer
        assert listed.status_code == 200
        names = [c["name"].rsplit("/", 1)[-1] for c in listed.json.get(
            "modelDevelopmentClusters", [])]
        assert "c1" in names
        assert [n for n in names if n != "c1"] == [f"c{i}" for i, r in zip((2, 3), refused,
                                                                          strict=True)
                                                   if r.status_code == 200]
        assert loop.alive
        checks = readiness(app, loop)
        loop.settle(3.0)
        os.remove(ballast)  # space returns
        again = client.post(f"{clusters}?modelDevelopmentClusterId=c9",
                            json=cluster_body(workers=1), headers=AUTH)
        assert again.status_code == 200, again.json
        assert loop.alive and checks["store"]() is None
    finally:
        loop.stop()
        app.compute.kill_all()
        app.close()
