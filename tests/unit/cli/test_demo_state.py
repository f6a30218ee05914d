"""`mtc demo` keeps its state in a directory of its own and deletes only what it made."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from services.cli import demo
from services.cli.main import main
from shared.domain.errors import ValidationError


@pytest.fixture
def no_story(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Run the demo's setup path for real (directory, embedded app) but not its story."""
    ran: list[Path] = []

    def run_demo(app: Any, *, steps: int = 120) -> None:
        ran.append(Path(app.state_dir))

    monkeypatch.setattr(demo, "run_demo", run_demo)
    monkeypatch.delenv("MTC_STATE_DIR", raising=False)
    return ran


def test_demo_keeps_unrelated_files(no_story: list[Path], tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "mine"
    state.mkdir()
    (state / "notes.txt").write_text("mine")
    (state / "mtc.db").write_text("my control plane")
    for _ in range(2):  # the second run deletes the first run's directory, and only that
        assert main(["--state-dir", str(state), "demo", "--steps", "1"]) == 0
        assert (state / "notes.txt").read_text() == "mine"
        assert (state / "mtc.db").read_text() == "my control plane"
        own = state / demo.STATE_SUBDIR
        assert no_story[-1].resolve() == own.resolve() and (own / demo.SENTINEL).is_file()
        assert not (own / "left-by-the-demo").exists()
        (own / "left-by-the-demo").write_text("x")

    # MTC_STATE_DIR names a directory the same way
    monkeypatch.setenv("MTC_STATE_DIR", str(state))
    assert main(["demo"]) == 0
    assert (state / "notes.txt").read_text() == "mine"
    assert not (state / demo.STATE_SUBDIR / "left-by-the-demo").exists()
    monkeypatch.delenv("MTC_STATE_DIR")

    # a non-empty directory the demo did not make is refused and left as it was
    theirs = tmp_path / "theirs"
    (theirs / demo.STATE_SUBDIR).mkdir(parents=True)
    (theirs / demo.STATE_SUBDIR / "keep.txt").write_text("keep")
    capsys.readouterr()
    assert main(["--state-dir", str(theirs), "demo"]) == 2
    err = capsys.readouterr().err
    assert "--state-dir" in err and "did not make it" in err
    assert (theirs / demo.STATE_SUBDIR / "keep.txt").read_text() == "keep"
    assert not (theirs / demo.STATE_SUBDIR / demo.SENTINEL).exists()

    # by default: var/demo, its own
    monkeypatch.chdir(tmp_path)
    assert main(["demo"]) == 0
    assert (tmp_path / "var" / "demo" / demo.SENTINEL).is_file()
    assert (state / "notes.txt").read_text() == "mine"


def test_fresh_state_removes_only_a_directory_bearing_its_sentinel(tmp_path: Path) -> None:
    own = demo.fresh_state(tmp_path / "d")
    (own / "old").write_text("x")
    assert demo.fresh_state(own) == own and not (own / "old").exists()
    (own / demo.SENTINEL).unlink()
    (own / "old").write_text("x")
    with pytest.raises(ValidationError, match="--state-dir"):
        demo.fresh_state(own)
    assert (own / "old").exists()
    a_file = tmp_path / "f"
    a_file.write_text("x")
    with pytest.raises(ValidationError):
        demo.fresh_state(a_file)
    link = tmp_path / "link"
    link.symlink_to(own)
    with pytest.raises(ValidationError):
        demo.fresh_state(link)
    assert (own / "old").exists() and a_file.exists()
