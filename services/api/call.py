"""One API call as a route's handler sees it: who, where, the path's ids, the query, the body.

Free of Flask so that a handler (and the resource kit, ``services.api.collection``) is plain
code over values; ``services.api.http`` builds a ``Call`` from the request it dispatches.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from services.api.context import ApiContext
from services.api.errors import ApiError, FieldViolation
from services.api.names import Parent


@dataclass(frozen=True)
class Call:
    ctx: ApiContext
    parent: Parent
    path: Mapping[str, str]  # the route's named groups: rid, node, ...
    args: Mapping[str, str]  # the query string
    read: Callable[[bool], dict[str, Any]]  # the body as a JSON object (``bodies.read_body``)
    principal: str

    @property
    def rid(self) -> str:
        """The resource id in the path (``{collection}/{rid}``)."""
        return self.path["rid"]

    def body(self, required: bool = True) -> dict[str, Any]:
        """The body, checked (size, UTF-8, JSON object, depth); ``{}`` when absent and not
        ``required``."""
        return self.read(required)

    def arg(self, name: str) -> str | None:
        return self.args.get(name)

    def flag(self, name: str) -> bool:
        """A boolean query parameter (``force=true``); anything but true/false/1/0 is a 400."""
        raw = self.args.get(name, "false").lower()
        if raw not in ("true", "false", "1", "0"):
            raise ApiError("INVALID_ARGUMENT", f"{name}: must be true or false",
                           [FieldViolation(name, "must be true or false")])
        return raw in ("true", "1")
