"""The worker protocol has one definition, the in-job SDK's (``mtc_program.protocol``): no
code outside it spells a protocol name as a string literal, a checkpoint file name, or an
exit code's number. Docstrings and comments may name them (they explain); code imports them.

A few files state the protocol themselves on purpose, each for the reason given in
``ALLOWED``; for the ones run by file path, a test here checks they say what the SDK says."""

from __future__ import annotations

import ast
import importlib.util
import re
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from mtc_program import protocol

ROOT = Path(__file__).resolve().parents[3]
SCANNED = ("shared", "services", "simulator", "examples", "bench", "scripts", "main.py")
SDK = ROOT / "shared" / "sdk"

# where a literal is the point
ALLOWED = {
    # programs that speak the protocol without the SDK, as any program may (they show how)
    "examples/hp_trial.py": "a tuning trial written without the SDK",
    "examples/torch_ddp.py": "a plain PyTorch DDP program written without the SDK",
    # run by file path, standard library only, without the package (the launcher runs as
    # root under `python -I`: it imports nothing); test_by_path_programs_agree_with_the_sdk
    "shared/adapters/compute/worker_launcher.py": "run by path under python -I, imports nothing",
    "shared/launch/pyenv.py": "run by path on the node before the program",
    "shared/launch/torch_node.py": "run by path on the node, around torchrun",
    "shared/adapters/compute/slurm/handover.py": "run by path under python -I -S in a task",
}

# the names a program reads that are mtc's or Vertex's (torchrun's RANK, WORLD_SIZE, ... are
# torch's own and common words in code: not checked)
NAMES = tuple(n for n in protocol.NAMES
              if n.startswith(("MTC_", "AIP_", "CLOUD_ML_")) or n in ("CLUSTER_SPEC", "TF_CONFIG"))
NAME_RE = re.compile(r"\b(" + "|".join(sorted(NAMES, key=len, reverse=True)) + r")\b")
# file names of the protocol's layout
FILE_RE = re.compile(r"(?<![\w-])ckpt-|\.save_s\b|\.manifest\.json|mtc-progress|mtc-advice\.env")
# exit codes with a meaning of their own (75, 137, 143): a bare number in code is a copy
EXIT_CODES = {int(protocol.ExitCode.PREEMPTED), int(protocol.ExitCode.KILLED),
              int(protocol.ExitCode.TERMINATED)}


def _files() -> Iterator[Path]:
    for name in SCANNED:
        path = ROOT / name
        found = [path] if path.is_file() else sorted(path.rglob("*.py"))
        yield from (f for f in found if not f.is_relative_to(SDK))


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring nodes (module, class, function)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def stray(path: Path) -> list[str]:
    """The protocol literals in ``path``'s code, as ``line: text``."""
    tree = ast.parse(path.read_text(), str(path))
    skip = _docstrings(tree)
    hits: list[str] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Constant) or id(node) in skip:
            continue
        value = node.value
        if isinstance(value, bytes):
            value = value.decode("latin-1")
        if isinstance(value, str) and (NAME_RE.search(value) or FILE_RE.search(value)):
            hits.append(f"{node.lineno}: {value[:60]!r}")
        elif type(value) is int and value in EXIT_CODES:
            hits.append(f"{node.lineno}: {value}")
    return hits


def test_the_names_checked_are_the_protocols() -> None:
    assert "MTC_TIER1_DIR" in NAMES and "AIP_CHECKPOINT_DIR" in NAMES and "RANK" not in NAMES
    assert stray.__doc__ and NAME_RE.search("x = 'MTC_RESTART_FILE'")
    assert not NAME_RE.search("MTC_RESTART_FILES")


def test_no_protocol_literal_outside_the_sdk() -> None:
    found = {}
    for path in _files():
        rel = path.relative_to(ROOT).as_posix()
        if rel not in ALLOWED and (hits := stray(path)):
            found[rel] = hits
    assert found == {}, "import these from mtc_program.protocol: " + "\n".join(
        f"{f}: {h}" for f, hits in found.items() for h in hits)


def test_the_allow_list_names_files_that_exist_and_need_it() -> None:
    for rel in ALLOWED:
        assert (ROOT / rel).is_file(), rel
        assert stray(ROOT / rel), f"{rel} states no protocol literal: take it off the list"


def _by_path(rel: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"by_path_{Path(rel).stem}", ROOT / rel)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("rel", "names"), [
    ("shared/adapters/compute/worker_launcher.py",
     {"EXIT_NOT_FOUND": protocol.ExitCode.NOT_FOUND,
      "EXIT_NOT_EXECUTABLE": protocol.ExitCode.NOT_EXECUTABLE,
      "EXIT_PREEMPTED": protocol.ExitCode.PREEMPTED,
      "JOB_DIRS": protocol.JOB_DIRS, "TERMINATION_LOG": protocol.TERMINATION_LOG}),
    ("shared/launch/torch_node.py", {"PREEMPTED": protocol.ExitCode.PREEMPTED}),
    ("shared/adapters/compute/slurm/handover.py", {"GONE": protocol.ExitCode.KILLED,
                                                   "KEEP": (protocol.RESTART_FILE,)}),
    ("shared/launch/pyenv.py", {"TERMINATION_LOG": protocol.TERMINATION_LOG,
                                "RUNTIME": protocol.RUNTIME}),
])
def test_by_path_programs_agree_with_the_sdk(rel: str, names: dict[str, object]) -> None:
    """What the files run by path restate is what the protocol says."""
    module = _by_path(rel)
    assert {n: getattr(module, n) for n in names} == names
