"""The torch helpers read a ``gs://`` directory as Vertex's programs do: at its ``/gcs/`` path
(``protocol.local_path``), so the recipes and ``examples/`` write where the sandbox binds the
job's objects; a local path (unsandboxed, Slurm, by hand) is read as it is."""

from __future__ import annotations

from pathlib import Path

from mtc_program import protocol as p
from mtc_program.torch_runtime import Env


def test_gs_directories_are_read_at_gcs() -> None:
    env = Env.read({p.CHECKPOINT_DIR: "gs://b/r/checkpoints/", p.MODEL_DIR: "gs://b/r/model/",
                    p.TENSORBOARD_LOG_DIR: "gs://b/r/logs/"})
    assert (env.checkpoint_dir, env.model_dir, env.tensorboard_dir) == (
        Path("/gcs/b/r/checkpoints"), Path("/gcs/b/r/model"), Path("/gcs/b/r/logs"))


def test_local_directories_are_read_as_they_are(tmp_path: Path) -> None:
    env = Env.read({p.CHECKPOINT_DIR: str(tmp_path / "c"), p.MODEL_DIR: str(tmp_path / "m")})
    assert (env.checkpoint_dir, env.model_dir, env.tensorboard_dir) == (
        tmp_path / "c", tmp_path / "m", None)
    assert Env.read({}, output=tmp_path).model_dir == tmp_path / "model"  # run by hand
