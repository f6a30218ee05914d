"""The layer rules hold: the import-linter contracts in pyproject.toml, module sizes, and no
pointers to documents that are not in the repository."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("shared", "services", "simulator")
SIZED = (*PACKAGES, "bench", "examples")  # the module size rule's trees
MAX_LINES = 500


def _lint_imports() -> str | None:
    found = Path(sys.executable).with_name("lint-imports")
    return str(found) if found.exists() else shutil.which("lint-imports")


def test_import_contracts_hold() -> None:
    exe = _lint_imports()
    assert exe is not None, "import-linter is a dev dependency: lint-imports must be installed"
    run = subprocess.run([exe, "--no-cache"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "BROKEN" not in run.stdout
    # every contract named in pyproject.toml was checked
    names = re.findall(r'^name = "(.+)"$', (ROOT / "pyproject.toml").read_text(), re.M)
    assert len(names) >= 4
    assert re.search(r"Contracts: (\d+) kept, 0 broken", run.stdout), run.stdout[-2000:]


def _modules() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


@pytest.mark.parametrize("package", SIZED)
def test_no_module_is_over_the_size_limit(package: str) -> None:
    big = {str(p.relative_to(ROOT)): n for p in (ROOT / package).rglob("*.py")
           if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert big == {}, f"modules over {MAX_LINES} lines: split them by concern"


def test_code_cites_public_sources_not_the_reference_folder() -> None:
    """``../shared/reference`` is beside the checkout, not in it: code cites public sources."""
    pointers = [str(p.relative_to(ROOT)) for p in _modules()
                if "shared/reference" in p.read_text() or "reference/" in p.read_text()]
    data = [str(p.relative_to(ROOT)) for p in (ROOT / "shared").rglob("*.yaml")
            if "reference/" in p.read_text()]
    assert pointers + data == []


def test_shared_never_loads_services_dynamically() -> None:
    """import-linter sees static imports; ``importlib`` by name would hide a layer break."""
    dynamic = [str(p.relative_to(ROOT)) for p in (ROOT / "shared").rglob("*.py")
               if re.search(r"import_module\(|__import__\(", p.read_text())]
    assert dynamic == []
