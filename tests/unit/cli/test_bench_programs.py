"""`mtc bench recovery --program`: the job the live runs submit, and the restore each
program's log reports (the step a resumed attempt counts from)."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.cli.bench_live import RESTORED, job_spec
from shared.resilience.trace import load_trace


@pytest.mark.parametrize(("program", "script"), [("train", "train.py"),
                                                 ("torch", "torch_inprocess.py")])
def test_the_job_runs_the_program_asked_for(program: str, script: str) -> None:
    trace = load_trace(None)
    [pool] = job_spec(trace, None, program)["jobSpec"]["workerPoolSpecs"]
    container = pool["containerSpec"]
    assert Path(container["command"][-1]).name == script
    memory = "--memory-every" in container["args"]
    assert memory == (program == "torch" and bool(trace.job.tier1_every))


@pytest.mark.parametrize(("line", "step"), [
    ("[r 0/4] restoring step 35 from the memory tier (/dev/shm/x)", 35),
    ("[r 0/4] resumed from step 20", 20),
    ("[torch_inprocess rank 0/4 pid 9] restore: step 40 from this process's memory"
     " (no tier read)", 40),
    ("[torch_inprocess rank 0/3 pid 9] resumed from ckpt-00000050 in 0.046s", 50),
])
def test_each_programs_restore_line_names_its_step(line: str, step: int) -> None:
    match = RESTORED.search(line)
    assert match is not None
    assert int(next(g for g in match.groups() if g is not None)) == step


def test_both_against_slurm_fits_the_twin_to_the_slurm_run(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    """``--target both --live slurm``: the live run is the Slurm one (started as root), and
    the twin plays the same trace with the costs fitted to it. The Slurm run is stood in by a
    twin run here (it needs root and a Slurm install; tests/integration/slurm runs it)."""
    from dataclasses import replace

    from services.cli import bench_slurm
    from services.cli.bench_recovery import play
    from services.cli.bench_twin import run as run_twin

    trace = load_trace(None)
    played: list[str | None] = []

    def fake_slurm(trace_: object, state: Path, *, pin: str | None, **_: object) -> object:
        played.append(pin)
        return replace(run_twin(trace), target="slurm", label=pin or "chosen")

    monkeypatch.setattr(bench_slurm, "require_root", lambda: None)
    monkeypatch.setattr(bench_slurm, "run_slurm", fake_slurm)
    runs = play(trace, target="both", compare=None, state_root=tmp_path, timeout_s=10,
                say=lambda _: None, live="slurm")
    assert played == [None]
    assert [r.target for r in runs] == ["slurm", "twin"]
    assert runs[1].costs and "startup_s" in runs[1].costs  # fitted to the Slurm run
