"""`mtc sim run llama3.yaml` outside the repository said "cannot read"; the
packaged scenarios run by name from anywhere and `mtc sim scenarios` lists them."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.cli.main import main
from simulator.scenario import ScenarioError, load_raw, packaged


def test_packaged_scenarios_load_by_name_from_any_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
        ) -> None:
    monkeypatch.chdir(tmp_path)
    names = [p.stem for p in packaged()]
    assert {"llama3", "small", "llama3-tiers"} <= set(names)
    assert load_raw("llama3") == load_raw("llama3.yaml")
    assert load_raw("small")["cluster"]
    assert main(["sim", "scenarios"]) == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in names)
    with pytest.raises(ScenarioError, match="mtc sim scenarios"):
        load_raw("no-such-scenario")
    (tmp_path / "small.yaml").write_text("{seed: 7}\n", encoding="utf-8")
    assert load_raw("small.yaml") == {"seed": 7}  # a file that exists wins over the name
