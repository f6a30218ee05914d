"""scripts/install_agent.sh: files and modes, idempotent, --dry-run changes nothing, bad
arguments refused; the unit passes ``systemd-analyze verify`` where systemd is installed."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "install_agent.sh"
UNIT = ROOT / "deploy" / "systemd" / "mtc-node-agent.service"
API = ["--transport", "api", "--api-url", "http://127.0.0.1:8080",
       "--cluster", "projects/p/locations/l/modelDevelopmentClusters/c1"]


def install(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def test_installs_the_config_the_token_and_the_unit_once(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    root = tmp_path / "root"
    args = ["--root", str(root), "--no-pip", "--node-id", "n-7", *API, "--token-file", str(token)]
    first = install(*args)
    assert first.returncode == 0, first.stderr
    assert "installed (api)" in first.stdout
    config = json.loads((root / "etc/mtc/agent.json").read_text())
    assert config["node_id"] == "n-7"
    assert config["delivery"] == {
        "transport": "api", "api_url": "http://127.0.0.1:8080",
        "cluster": "projects/p/locations/l/modelDevelopmentClusters/c1",
        "token_file": "/run/credentials/mtc-node-agent.service/token",
        "spool_path": "/var/lib/mtc-agent/spool.sqlite3"}
    secret = root / "etc/mtc/agent.token"
    assert secret.read_text() == "s3cret\n" and secret.stat().st_mode & 0o777 == 0o600
    dropin = root / "etc/systemd/system/mtc-node-agent.service.d/credentials.conf"
    assert "LoadCredential=token:/etc/mtc/agent.token" in dropin.read_text()
    assert (root / "etc/systemd/system/mtc-node-agent.service").read_text() == UNIT.read_text()

    again = install(*args)
    assert again.returncode == 0 and again.stdout.strip().endswith("install_agent: unchanged")
    assert "+ wrote" not in again.stdout


def test_dry_run_prints_the_plan_and_writes_nothing(tmp_path: Path) -> None:
    root = tmp_path / "root"
    done = install("--dry-run", "--root", str(root), "--transport", "pubsub", "--project", "p1")
    assert done.returncode == 0, done.stderr
    assert "pip install" in done.stdout and r"mtc\[agent\]" in done.stdout  # (printf %q)
    assert "dry run, nothing changed" in done.stdout
    assert '"transport": "pubsub"' in done.stdout and '"project": "p1"' in done.stdout
    assert not root.exists()


@pytest.mark.parametrize(("args", "message"), [
    (["--transport", "kafka"], "--transport must be pubsub or api"),
    (["--transport", "api"], "needs --api-url, --cluster and --token-file"),
    (["--node-id", "a;rm -rf /"], "is not a node name"),
    (["--bogus"], "unknown option --bogus"),
])
def test_bad_arguments_are_refused(args: list[str], message: str, tmp_path: Path) -> None:
    done = install("--root", str(tmp_path), "--no-pip", *args)
    assert done.returncode == 2 and message in done.stderr
    assert not (tmp_path / "etc").exists()


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd not installed")
def test_the_unit_verifies(tmp_path: Path) -> None:
    unit = tmp_path / UNIT.name
    unit.write_text(UNIT.read_text().replace("/opt/mtc-agent/venv/bin/mtc-agent", "/bin/true"))
    done = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
