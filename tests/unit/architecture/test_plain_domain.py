"""The domain and the policies are plain Python: no generated code, no object construction
behind the constructors' back, no caches keyed by object identity, no reading of an enum's
private value. Speed-ups of that kind belong to the adapters (``shared.adapters.mapper``).

The rule reads the source's tokens (comments and strings do not count)."""

from __future__ import annotations

import io
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PLAIN = ("shared/domain", "shared/policies")


def violations(source: str) -> list[str]:
    """What ``source`` does that plain domain code does not: ``exec(``, any use of
    ``__new__`` (``object.__new__(cls)``, ``tuple.__new__``), a call of the builtin ``id(``
    (a cache keyed by identity), and ``._value_``."""
    tokens = [t for t in tokenize.generate_tokens(io.StringIO(source).readline)
              if t.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE,
                                tokenize.INDENT, tokenize.DEDENT)]
    found = []
    for i, tok in enumerate(tokens):
        if tok.type != tokenize.NAME:
            continue
        before = tokens[i - 1].string if i else ""
        after = tokens[i + 1].string if i + 1 < len(tokens) else ""
        line = tok.start[0]
        if tok.string == "exec" and after == "(" and before != ".":
            found.append(f"line {line}: exec(")
        elif tok.string == "__new__":
            found.append(f"line {line}: __new__")
        elif tok.string == "id" and after == "(" and before not in (".", "def"):
            found.append(f"line {line}: id(")
        elif tok.string == "_value_" and before == ".":
            found.append(f"line {line}: ._value_")
    return found


def _sources() -> list[Path]:
    return sorted(p for d in PLAIN for p in (ROOT / d).rglob("*.py"))


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_domain_and_the_policies_are_plain(path: Path) -> None:
    assert violations(path.read_text()) == [], path.relative_to(ROOT)


def test_the_rule_finds_what_the_old_domain_did() -> None:
    """Each shortcut the domain once held (generated inits, a fast decode, an identity-keyed
    cache, tuple.__new__ for NamedTuples, enum values read privately) is found; the same
    words in comments and strings, and methods of those names, are not."""
    old = {
        "exec(source, dict(defaults), namespace)": "exec(",
        "part = object.__new__(cls)": "__new__",
        "_tuple_new = tuple.__new__": "__new__",
        "held = _HOLES.get(id(node_ids))": "id(",
        "status = cstatus._value_": "._value_",
    }
    for line, what in old.items():
        assert [v.split(": ")[1] for v in violations(line + "\n")] == [what], line
    fine = ('x = "exec(id(y))"  # object.__new__(cls), ._value_\n'
            "def id(self) -> str: ...\n"
            "n = job.id()\n"
            "v = status.value\n")
    assert violations(fine) == []
