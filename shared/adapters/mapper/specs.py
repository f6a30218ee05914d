"""Parsed specs and their documents by entity id: the job and cluster mappers' caches.

A job or cluster document is decoded, and encoded again at commit to see whether it changed,
on every event that touches it; its spec rarely changes, and parsing validates every field
(a cluster of 128 partitions encodes hundreds of dicts). An equal spec document gives the
same immutable spec back; the same spec gives an equal document back.

The cache keeps its own copy of each document, which it never hands out: a holder that
changes a document it was given (in place, nested values too) cannot change what the cache
answers. The document it hands out is handed out again only while it still equals that copy.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

S = TypeVar("S")


def _copy(value: Any) -> Any:
    """A copy of a JSON-like tree (dicts and lists copied, anything else shared)."""
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


class _Entry(Generic[S]):
    __slots__ = ("kept", "out", "spec")

    def __init__(self, kept: dict[str, Any], out: dict[str, Any], spec: S) -> None:
        self.kept = kept  # the cache's own copy: never handed out
        self.out = out  # the document handed out (may have been changed since)
        self.spec = spec


class ParseCache(Generic[S]):
    """``cache(key, doc)``: the spec of ``doc``; ``cache.doc(key, spec)``: its document. At
    most ``size`` entities are remembered (the oldest forgotten first)."""

    def __init__(self, parse: Callable[[Mapping[str, Any]], S],
                 encode: Callable[[S], dict[str, Any]], size: int = 4096) -> None:
        self._parse = parse
        self._encode = encode
        self._size = size
        self._entries: dict[str, _Entry[S]] = {}

    def __call__(self, key: str, doc: Mapping[str, Any]) -> S:
        hit = self._entries.get(key)
        if hit is not None and hit.kept == doc:
            return hit.spec
        spec = self._parse(doc)
        out = doc if type(doc) is dict else dict(doc)  # (the stored one: compares as itself)
        self._keep(key, _copy(out), out, spec)
        return spec

    def doc(self, key: str, spec: S) -> dict[str, Any]:
        hit = self._entries.get(key)
        if hit is not None and hit.spec is spec:
            if hit.out != hit.kept:  # changed by a holder: a fresh one
                hit.out = _copy(hit.kept)
            return hit.out
        doc = self._encode(spec)
        self._keep(key, _copy(doc), doc, spec)
        return doc

    def _keep(self, key: str, kept: dict[str, Any], out: dict[str, Any], spec: S) -> None:
        if key not in self._entries and len(self._entries) >= self._size:
            del self._entries[next(iter(self._entries))]
        self._entries[key] = _Entry(kept, out, spec)
