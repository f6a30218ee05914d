"""YAML read through libyaml where the wheel has it: the pure-Python parser spends about
0.2 s on the triage table alone, at the start of every command and function."""

from __future__ import annotations

from typing import Any

import yaml

SafeLoader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def safe_load(text: str | bytes) -> Any:
    """``yaml.safe_load``, the same documents and the same errors (``yaml.YAMLError``)."""
    return yaml.load(text, Loader=SafeLoader)
