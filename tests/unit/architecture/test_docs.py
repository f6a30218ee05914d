"""README.md and docs/*.md describe the product as it is: every relative link and every repo
path they name exists, and they carry no development history (issue numbers, "Done-when").
How the product got there belongs in CHANGELOG.md, which this test does not read."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^```.*?^```[^\n]*$", re.S | re.M)
LINK = re.compile(r"\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
SPAN = re.compile(r"`([^`\n]+)`")
# a repo path as docs name it: under a top-level folder of the tree, naming a file
TOP = ("shared", "services", "simulator", "bench", "scripts", "examples", "deploy", "docs",
       "tests", "workflows")
FILE_PATH = re.compile(rf"^(?:{'|'.join(TOP)})/[\w./-]*\.(?:py|md|ya?ml|json|sh|toml)$")
HISTORY = re.compile(r"\bissues?\s*#?\s*\d+|\bdone[- ]when\b", re.I)


def _prose(text: str) -> str:
    """The text without its fenced blocks (commands and output, where a `[x](y)` is no link)."""
    return FENCE.sub("", text)


def _where(doc: Path, text: str, at: int) -> str:
    return f"{doc.relative_to(ROOT)}:{text.count(chr(10), 0, at) + 1}"


def test_the_docs_are_found() -> None:
    assert (ROOT / "README.md").is_file()
    assert len(DOCS) > 5, DOCS


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: str(d.relative_to(ROOT)))
def test_every_relative_link_points_at_a_file_that_exists(doc: Path) -> None:
    text = doc.read_text()
    prose = _prose(text)
    broken = []
    for m in LINK.finditer(prose):
        target = m.group(1)
        if SCHEME.match(target) or target.startswith("#"):
            continue  # a URL, or an anchor in this document (anchors are not checked)
        path = target.split("#", 1)[0]
        if not (doc.parent / path).exists():
            broken.append(f"{_where(doc, prose, m.start())}: {target}")
    assert not broken, "links to files that do not exist:\n" + "\n".join(broken)


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: str(d.relative_to(ROOT)))
def test_every_backticked_repo_file_exists(doc: Path) -> None:
    prose = _prose(doc.read_text())
    missing = []
    for m in SPAN.finditer(prose):
        for token in m.group(1).split():
            path = token.strip("()[],;'\"").split("::", 1)[0]
            path = re.sub(r":\d+$", "", path)  # file.py:42
            if FILE_PATH.match(path) and not (ROOT / path).is_file():
                missing.append(f"{_where(doc, prose, m.start())}: {path}")
    assert not missing, "paths to files that do not exist:\n" + "\n".join(missing)


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: str(d.relative_to(ROOT)))
def test_no_development_history(doc: Path) -> None:
    text = doc.read_text()
    found = [f"{_where(doc, text, m.start())}: {m.group(0)!r}" for m in HISTORY.finditer(text)]
    assert not found, ("issue numbers or Done-when in a product doc (the story goes to "
                       "CHANGELOG.md):\n" + "\n".join(found))


@pytest.mark.parametrize(("text", "hits"), [
    ("since issue 25 it runs", 1), ("Issue #11, item 8", 1), ("the issues 2 and 5", 1),
    ("the Done-when asks", 1), ("done when it passes", 1), ("an issue tracker", 0),
    ("tissue 3", 0),
])
def test_the_history_pattern(text: str, hits: int) -> None:
    assert len(HISTORY.findall(text)) == hits


@pytest.mark.parametrize(("span", "is_path"), [
    ("shared/policies/repair.py", True), ("docs/recovery.md", True),
    ("simulator/scenarios/llama3.yaml", True), ("shared/sdk/", False), ("gce/split.py", False),
    ("/openapi.json", False), ("shared/resilience/data/*.yaml", False),
    ("shared.policies.recovery.choose", False),
])
def test_the_path_pattern(span: str, is_path: bool) -> None:
    assert bool(FILE_PATH.match(span)) is is_path


CODE_TREES = ("shared", "services", "simulator", "bench", "examples", "scripts", "workflows",
              "tests")


def test_no_development_history_in_code_comments() -> None:
    """Comments and docstrings say why, not how the code got here: no issue numbers."""
    found = []
    for tree in CODE_TREES:
        for path in sorted((ROOT / tree).rglob("*.py")):
            if path == Path(__file__).resolve() or ".venv" in path.parts:
                continue
            text = path.read_text()
            found += [f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}: "
                      f"{m.group(0)!r}" for m in HISTORY.finditer(text)]
    assert not found, "issue numbers in code (the story goes to CHANGELOG.md):\n" + "\n".join(
        found)
