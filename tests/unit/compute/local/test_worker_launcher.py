"""The launcher: runs a command, relays SIGTERM once, leaves the exit code in a file."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from shared.adapters.compute import worker_launcher
from shared.adapters.compute.worker_launcher import exit_code_of

LAUNCHER = Path(worker_launcher.__file__)
PY = sys.executable
pytestmark = pytest.mark.slow  # the launcher and its children as real processes


def launch(exit_file: Path, *command: str, new_session: bool = True) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [PY, str(LAUNCHER), "--exit-file", str(exit_file), "--", *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=new_session,
    )


@pytest.mark.parametrize("code", [0, 3])
def test_exit_code_is_written_and_returned(tmp_path: Path, code: int) -> None:
    exit_file = tmp_path / "x" / "rank-0.exit"
    proc = launch(exit_file, PY, "-c", f"import sys; sys.exit({code})")
    assert proc.wait(timeout=10) == code
    assert exit_file.read_text() == f"{code}\n"
    left = sorted(p.name for p in exit_file.parent.iterdir())  # no temp left; a failure's
    assert left == ["rank-0.exit", *(["rank-0.exit.disk"] if code else [])]  # disk readings


def test_runs_as_a_module_too(tmp_path: Path) -> None:
    exit_file = tmp_path / "e"
    cmd = [PY, "-m", "shared.adapters.compute.worker_launcher", "--exit-file", str(exit_file), "--"]
    done = subprocess.run([*cmd, PY, "-c", "print('hi')"], capture_output=True, timeout=10)
    assert done.returncode == 0 and done.stdout == b"hi\n" and exit_file.read_text() == "0\n"


def test_a_child_killed_by_a_signal_is_128_plus_n(tmp_path: Path) -> None:
    exit_file = tmp_path / "e"
    proc = launch(exit_file, PY, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert proc.wait(timeout=10) == 137
    assert exit_file.read_text() == "137\n"
    assert exit_code_of(-15) == 143 and exit_code_of(2) == 2


def test_a_missing_command_is_127(tmp_path: Path) -> None:
    exit_file = tmp_path / "e"
    proc = launch(exit_file, "no-such-program-xyz")
    assert proc.wait(timeout=10) == 127
    assert exit_file.read_text() == "127\n"


@pytest.mark.parametrize("new_session", [True, False])
def test_sigterm_is_relayed_once_to_the_child_and_its_children(
    tmp_path: Path, new_session: bool
) -> None:
    """Leading its group, the launcher relays to the whole group; else to its child."""
    child = textwrap.dedent(
        """
        import signal, subprocess, sys, time
        seen = []
        signal.signal(signal.SIGTERM, lambda *a: seen.append(1))
        grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        print("ready", flush=True)
        while not seen:
            time.sleep(0.01)
        time.sleep(0.3)  # a second, duplicate SIGTERM would arrive by now
        try:
            gone = grandchild.wait(timeout=1) is not None
        except subprocess.TimeoutExpired:
            gone = False
            grandchild.kill()
        print(f"sigterms={len(seen)} grandchild_got_it={gone}", flush=True)
        sys.exit(75)
        """
    )
    exit_file = tmp_path / "e"
    proc = launch(exit_file, PY, "-c", child, new_session=new_session)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=10)
    assert proc.returncode == 75 and exit_file.read_text() == "75\n"
    assert f"sigterms=1 grandchild_got_it={new_session}" in out


def test_a_signal_before_the_child_exists_is_sent_once_it_does() -> None:
    relay = worker_launcher._Relay()
    relay.leads_group = False  # never signal pytest's own group, whoever leads it
    relay._handle(signal.SIGTERM, None)  # arrives while the launcher is still starting
    child = subprocess.Popen([PY, "-c", "import time; time.sleep(60)"])
    relay.started(child)
    assert child.wait(timeout=10) == -signal.SIGTERM and relay.pending == []


def test_usage_errors() -> None:
    done = subprocess.run([PY, str(LAUNCHER), "--exit-file", "x"], capture_output=True)
    assert done.returncode == 2 and b"no command" in done.stderr



def test_the_jobs_environment_reaches_only_its_command(tmp_path: Path) -> None:
    """The launcher may be root: it starts isolated with a fixed environment, as
    ``spawn_launcher`` starts it, and the job's environment reaches only the command: a
    ``PYTHONPATH`` with a planted ``sitecustomize.py`` runs nothing in the launcher (the
    command is no Python), and ``PYTHONHOME=/nonexistent`` does not kill it."""
    import os

    from shared.adapters.compute.local.procs import spawn_launcher

    planted, marker, seen = tmp_path / "planted", tmp_path / "PWNED", tmp_path / "seen"
    planted.mkdir()
    (planted / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'a').write('ran')\n")
    (tmp_path / "run").mkdir()
    for i, extra in enumerate(({"PYTHONPATH": str(planted)}, {"PYTHONHOME": "/nonexistent"})):
        exit_file, log = tmp_path / "run" / f"r{i}.exit", tmp_path / f"r{i}.log"
        env = {"PATH": "/usr/bin:/bin", "SEEN": f"yes{i}", **extra}
        pid = spawn_launcher(PY, exit_file, ["/bin/sh", "-c", f'echo "$SEEN" >> {seen}'], env,
                             log)
        os.waitpid(pid, 0)
        assert exit_file.read_text() == "0\n", log.read_text()
        assert not (tmp_path / "run" / f"r{i}.exit.env").exists(), "the job's env was left"
    assert not marker.exists(), "the launcher ran the job's PYTHONPATH"
    assert seen.read_text().split() == ["yes0", "yes1"]  # the command got the job's env
