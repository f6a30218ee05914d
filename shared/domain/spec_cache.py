"""Parsed specs and their documents, by entity id, for the entity codecs in ``model``."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from shared.domain.specs import ClusterSpec, CustomJobSpec

S = TypeVar("S")


class ParseCache(Generic[S]):
    """Specs and their documents by entity id. A job or cluster document is decoded and
    re-encoded (at commit, to see whether it changed) on every event that touches it, its
    spec far more rarely changes, and parsing validates every field, while a cluster of 128
    partitions encodes hundreds of dicts. An equal spec document gives the same immutable
    spec back; the same spec gives the same document back. Documents are values: nothing
    mutates a stored or loaded document in place (stores hand out shallow copies, so nested
    values are shared already)."""

    def __init__(self, parse: Callable[[Mapping[str, Any]], S],
                 encode: Callable[[S], dict[str, Any]], size: int = 4096) -> None:
        self._parse = parse
        self._encode = encode
        self._size = size
        self._entries: dict[str, tuple[Any, S]] = {}

    def __call__(self, key: str, doc: Mapping[str, Any]) -> S:
        hit = self._entries.get(key)
        if hit is not None and (hit[0] is doc or hit[0] == doc):
            return hit[1]
        spec = self._parse(doc)
        self._keep(key, copy.deepcopy(doc), spec)
        return spec

    def doc(self, key: str, spec: S) -> dict[str, Any]:
        hit = self._entries.get(key)
        if hit is not None and hit[1] is spec:
            return hit[0]  # type: ignore[no-any-return]
        doc = self._encode(spec)
        self._keep(key, doc, spec)
        return doc

    def _keep(self, key: str, doc: Any, spec: S) -> None:
        if key not in self._entries and len(self._entries) >= self._size:
            del self._entries[next(iter(self._entries))]
        self._entries[key] = (doc, spec)


cluster_specs = ParseCache(ClusterSpec.from_dict, ClusterSpec.to_dict)
job_specs = ParseCache(CustomJobSpec.from_dict, CustomJobSpec.to_dict)
