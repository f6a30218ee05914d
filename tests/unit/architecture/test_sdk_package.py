"""The in-job SDK installs alone: its wheel builds from ``shared/sdk``, installs into a bare
virtualenv with nothing else of mtc on its path, its public modules import there (the core
with numpy alone, the ``torch`` extra's with torch), and its typing ships with it
(``py.typed``: mypy checks a user's program against its annotations).

Offline: the wheel builds with this interpreter's setuptools (no build isolation) and the
bare venv gets its dependencies from this interpreter's site-packages, one distribution at a
time (a directory of links to exactly numpy, or torch and what torch requires, put on the
venv's path by a ``.pth``), so no ``shared``, ``services`` or ``simulator`` can come along."""

from __future__ import annotations

import importlib.metadata as md
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SDK = ROOT / "shared" / "sdk"
CORE = ("mtc_program", "mtc_program.protocol", "mtc_program.env", "mtc_program.signals",
        "mtc_program.entries", "mtc_program.cut", "mtc_program.tiers", "mtc_program.progress",
        "mtc_program.inprocess", "mtc_program.scalars", "mtc_program.peer_store")
TORCH = ("mtc_program.torch_checkpoint", "mtc_program.torch_tiers", "mtc_program.torch_runtime")
MTC = ("shared", "services", "simulator")

pytestmark = pytest.mark.slow


def run(*args: str | Path, cwd: Path | None = None, timeout: float = 300
        ) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, f"{args}: {done.stdout[-3000:]}{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    source = out / "source"  # a copy: the build leaves build/ and egg-info beside its source
    shutil.copytree(SDK, source, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
        "--no-index", "-w", out, source)
    found = sorted(out.glob("mtc_program-*.whl"))
    assert len(found) == 1, found
    return found[0]


def requirement_closure(name: str) -> list[md.Distribution]:
    """``name``'s distribution and those it requires (extras aside), as installed here."""
    seen: dict[str, md.Distribution] = {}
    todo = [name]
    while todo:
        key = re.sub(r"[-_.]+", "-", todo.pop()).lower()
        if key in seen:
            continue
        try:
            seen[key] = dist = md.distribution(key)
        except md.PackageNotFoundError:  # a requirement for another platform
            continue
        todo += [re.split(r"[\s;<>=!~\[(]", r, maxsplit=1)[0] for r in dist.requires or ()
                 if "extra ==" not in r]
    return list(seen.values())


def link_distributions(names: tuple[str, ...], into: Path) -> Path:
    """A directory of links to the top-level files of ``names`` and their requirements."""
    into.mkdir()
    for dist in (d for n in names for d in requirement_closure(n)):
        for top in {f.parts[0] for f in dist.files or () if len(f.parts) > 0}:
            source = Path(str(dist.locate_file(top)))
            if source.exists() and not (into / top).exists() and not top.endswith(".pth") \
                    and top not in ("..", "__pycache__"):
                (into / top).symlink_to(source)
    return into


@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Path:
    """A virtualenv holding the SDK's wheel and, on its path, numpy: its python."""
    root = tmp_path_factory.mktemp("bare")
    run(sys.executable, "-m", "venv", "--without-pip", root / "venv")
    python = root / "venv" / "bin" / "python"
    run(sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps",
        "--no-index", wheel)
    site = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))")
                .stdout.strip())
    (site / "core-deps.pth").write_text(f"{link_distributions(('numpy',), root / 'core')}\n")
    return python


def test_the_wheel_holds_the_package_its_typing_and_nothing_else(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    modules = {f"mtc_program/{p.name}" for p in (SDK / "mtc_program").glob("*.py")}
    assert modules | {"mtc_program/py.typed"} <= set(names)
    assert {n.split("/")[0] for n in names} == {"mtc_program", wheel.name.split("-py")[0] + ".dist-info"}
    meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("/METADATA"))).decode()
    project = tomllib.loads((SDK / "pyproject.toml").read_text())["project"]
    assert project["dependencies"] == ["numpy>=2.4.6,<3"]
    assert "Requires-Dist: numpy" in meta and "torch" in project["optional-dependencies"]


def test_the_control_planes_distribution_ships_the_sdk_once() -> None:
    """The root distribution maps the SDK's source root (``pip install -e .`` provides
    ``mtc_program``) and does not ship it a second time as ``shared.sdk``."""
    from setuptools import find_namespace_packages

    find = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    found = {where: find_namespace_packages(str(ROOT / where), include=find["include"],
                                            exclude=find.get("exclude", ()))
             for where in find["where"]}
    assert "shared.adapters" in found["."] and not [p for p in found["."] if "sdk" in p]
    assert found["shared/sdk"] == ["mtc_program"]


def test_the_core_imports_alone_with_numpy(bare: Path, tmp_path: Path) -> None:
    code = (
        "import importlib, importlib.util, sys\n"
        f"for name in {CORE!r}:\n    importlib.import_module(name)\n"
        f"assert all(importlib.util.find_spec(m) is None for m in {MTC!r}), sys.path\n"
        "assert 'torch' not in sys.modules\n"
        "import mtc_program\n"
        "assert mtc_program.__file__.startswith(sys.prefix), mtc_program.__file__\n"
        # a save and a restore, durable only: numpy at work
        "from pathlib import Path\n"
        "import numpy as np\n"
        "from mtc_program.tiers import TieredCheckpointer, TierSettings\n"
        "ck = TieredCheckpointer(TierSettings.from_env({}, durable_dir=Path('d'), rank=0,\n"
        "                                              world_size=1), log=lambda m: None)\n"
        "ck.save(3, {'w': np.arange(4.0)})\n"
        "got = ck.restore()\n"
        "assert got is not None and got.step == 3 and list(got.state['w']) == [0, 1, 2, 3]\n"
        "print('core ok')\n")
    assert "core ok" in run(bare, "-I", "-c", code, cwd=tmp_path).stdout


def test_a_users_program_is_type_checked_against_the_sdk(bare: Path, tmp_path: Path) -> None:
    """mypy --strict sees the SDK's annotations (no "missing library stubs or py.typed"):
    a right program passes, a wrong one is caught."""
    pytest.importorskip("mypy")
    good = ("from pathlib import Path\n"
            "from mtc_program.protocol import ExitCode\n"
            "from mtc_program.tiers import TieredCheckpointer, TierSettings\n"
            "settings = TierSettings.from_env({}, durable_dir=Path('d'), rank=0, world_size=1)\n"
            "report = TieredCheckpointer(settings).save(1, {})\n"
            "blocked: float = report.blocking_s\n"
            "code: int = ExitCode.PREEMPTED\n")
    (tmp_path / "good.py").write_text(good)
    (tmp_path / "bad.py").write_text(good + "wrong: str = report.blocking_s\n")
    mypy = (sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--config-file", "",
            "--python-executable", str(bare))
    run(*mypy, "good.py", cwd=tmp_path)
    bad = subprocess.run([*mypy, "bad.py"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=300)
    assert bad.returncode == 1 and 'has type "float", variable has type "str"' in bad.stdout, \
        bad.stdout + bad.stderr


def test_the_torch_extras_modules_import_with_torch(bare: Path, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    site = Path(run(bare, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))")
                .stdout.strip())
    links = link_distributions(("torch",), tmp_path / "torch")
    (site / "torch-deps.pth").write_text(f"{links}\n")
    try:
        code = ("import importlib, importlib.util\n"
                f"for name in {TORCH!r}:\n    importlib.import_module(name)\n"
                f"assert all(importlib.util.find_spec(m) is None for m in {MTC!r})\n"
                "print('torch ok')\n")
        assert "torch ok" in run(bare, "-I", "-c", code, cwd=tmp_path).stdout
    finally:
        (site / "torch-deps.pth").unlink()


def test_readmes_program_runs_on_the_sdk_alone(bare: Path, tmp_path: Path) -> None:
    """README's program on the SDK, as printed, in the bare venv: it trains to step 100,
    saves its durable checkpoint, and a second run resumes from it."""
    fences = re.findall(r"^```python\n(.*?)^```", (ROOT / "README.md").read_text(), re.S | re.M)
    [program] = [f for f in fences if "from mtc_program" in f]
    (tmp_path / "program.py").write_text(program)
    run(bare, "-I", "program.py", cwd=tmp_path)
    assert (tmp_path / "out" / "checkpoints" / "ckpt-00000100.npz").is_file()
    run(bare, "-I", "program.py", cwd=tmp_path)  # restored at step 100: nothing left to do
