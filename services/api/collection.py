"""The resource kit: list, get and cancel as every collection of the API does them.

A resource module says what is particular to it (how its resources are loaded and found
under a parent, how one is rendered, how one is stopped, its create and delete) and gets a
``Collection``: list with an AIP-160 filter and AIP-158 paging, get, cancel, and the handlers
the route table (``services.api.routes``) serves them by. Filters match the rendered wire
resource, so a filter sees exactly what a GET shows; a list without one renders only its page.
A collection that can ``seek`` reads a list from the store a page at a time (an index's
range, keyset page tokens) and bounds what a filtered page examines.
Creates share a generated id, the check of the cluster a resource runs on, and the answer to
a retried create (``prior_create``): a create the client names by its own id, or by a
``requestId`` (AIP-155) from which the id it gets is derived, answers a retry with what the
first one made.
"""

from __future__ import annotations

import functools
import hashlib
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from services.api import ids, names
from services.api import operations as ops
from services.api.call import Call
from services.api.context import RESOURCES, ApiContext, create_id, find_record, resource_key
from services.api.errors import ApiError, FieldViolation, invalid
from services.api.names import Parent
from services.api.paging import (
    Page,
    Term,
    cursor_token,
    matches,
    page_size,
    paginate,
    parse_filter,
    resource_field,
    token_cursor,
)
from services.api.wire.proto_json import Message

T = TypeVar("T")
Json = dict[str, Any]
SCAN_CHUNK = 100  # a filtered list reads up to this many items from the store at a time
SCAN_ITEMS = 500  # and examines at most this many in one call,
RENDERED_ITEMS = 100  # rendering at most this many (those its pushdown kept)


@dataclass(frozen=True)
class Scope:
    """What a collection's functions read through: the call's context, its unit of work, the
    parent, and for a nested collection (a model's versions, a cluster's nodes) its owner."""

    ctx: ApiContext
    uow: Any
    parent: Parent
    owner: str = ""

    def operation(self, *, target: str, target_id: str, verb: str, generation: int,
                  response: Json | None = None) -> Json:
        """The long-running Operation of a change (the same one on a retry)."""
        return ops.start(self.uow, self.parent, target=target, target_id=target_id, verb=verb,
                         generation=generation, now=self.ctx.now,
                         retention_s=self.ctx.runtime.deps.config.retention_s,
                         response=response)


@dataclass(frozen=True)
class Collection(Generic[T]):
    """One kind of resource. ``load`` yields what is under the scope in list order (what is
    gone already left out), ``find`` one by id or NOT_FOUND, ``render`` one as the wire
    resource (a dict the ``item`` model validates); the list answer is ``response`` with the
    page in its ``items_field``. ``create``, ``remove`` (delete) and ``stop`` (cancel) where
    the resource has them; a new resource's client-chosen id is the ``id_param`` query.
    ``create(ctx, parent, body, chosen_id, generated_id)``: ``generated_id`` (from a
    ``requestId``, None: a new one) is the id a create makes when the client chose none."""

    response: type[Message]
    items_field: str
    item: type[Message]
    load: Callable[[Scope], Iterable[T]]  # cheap items: a page is cut before rendering
    render: Callable[[Scope, T], Json | None]  # None: gone since listed (left off the page)
    filterable: tuple[str, ...] = ()
    field: Callable[[Json, str], Any] = resource_field  # a filter term's value in a resource
    # keyset paging: up to ``limit`` entries after a key (None: from the start), each with
    # its own key (JSON), in list order, read from the store a page at a time (``load`` is
    # then not used for lists). Given a filter's terms it may push them down: leave out
    # what cannot match, or answer an entry's item None (looked at, and ruled out before
    # rendering); the rendered resource is matched after, so it may keep more than match.
    # Its ``render`` gives the ``item`` model's JSON (validated): a page is answered as is.
    seek: Callable[[Scope, Any, int, list[Term]], list[tuple[Any, T | None]]] | None = None
    find: Callable[[Scope, str], T] | None = None
    stop: Callable[[Scope, str, T], None] | None = None
    create: Callable[[ApiContext, Parent, Any, str | None, str | None], Json] | None = None
    id_param: str = ""
    remove: Callable[[ApiContext, Parent, str], Json] | None = None

    def list_page(self, ctx: ApiContext, parent: Parent, *, filter_text: str | None = None,
                  size: str | None = None, token: str | None = None, owner: str = "") -> Json:
        """One page of the resources under ``parent`` (and ``owner``) the filter matches."""
        terms = parse_filter(filter_text, self.filterable)
        limit = page_size(size)
        ctx.refresh()
        with ctx.unit() as uow:
            scope = Scope(ctx, uow, parent, owner)
            if self.seek is not None:  # its items are the item model's JSON already
                page = self._seek_page(scope, terms, limit, token, filter_text or "")
                answer = self.response(**{self.items_field: [],
                                          "next_page_token": page.next_page_token}).to_json()
                answer[self.response.model_fields[self.items_field].alias or ""] = page.items
                return answer
            found = list(self.load(scope))
            if terms:
                shown = [r for r in (self.render(scope, item) for item in found) if r is not None]
                kept = [r for r in shown if matches(terms, functools.partial(self.field, r))]
                page = paginate(kept, size=limit, token=token, filter_text=filter_text or "")
            else:  # only the page is rendered (a page of 1 of 5,000 jobs renders 1)
                page = paginate(found, size=limit, token=token, filter_text=filter_text or "")
                rendered = (self.render(scope, item) for item in page.items)
                page = Page([r for r in rendered if r is not None], page.next_page_token)
        items = [self.item.model_validate(r) for r in page.items]
        return self.response(**{self.items_field: items,
                                "next_page_token": page.next_page_token}).to_json()

    def _seek_page(self, scope: Scope, terms: list[Term], limit: int, token: str | None,
                   filter_text: str) -> Page:
        """A page read from the store a page at a time. Unfiltered: the page and one more
        item (is there a next page?), only the page rendered. Filtered: items in order until
        the page is full or ``SCAN_ITEMS`` were examined (``RENDERED_ITEMS`` rendered): a
        page may then be short, even empty, with a token to go on from (AIP-158), so no
        call costs the whole collection."""
        assert self.seek is not None
        after = token_cursor(token, filter_text)
        if not terms:
            rows = self.seek(scope, after, limit + 1, terms)
            rendered_page = (self.render(scope, item) for _, item in rows[:limit]
                             if item is not None)
            return Page([r for r in rendered_page if r is not None],
                        cursor_token(rows[limit - 1][0], filter_text) if len(rows) > limit
                        else "")
        kept: list[Json] = []
        examined = rendered = 0
        chunk = min(limit + 1, SCAN_CHUNK)  # a page's worth first: most filters match often
        while True:
            rows = self.seek(scope, after, chunk, terms)
            done = len(rows) < chunk  # the store has no more
            for i, (key, item) in enumerate(rows, 1):
                after, examined = key, examined + 1
                if item is not None:
                    rendered += 1
                    shown = self.render(scope, item)
                    if shown is not None and matches(terms, functools.partial(self.field,
                                                                              shown)):
                        kept.append(shown)
                if len(kept) == limit or examined >= SCAN_ITEMS or rendered >= RENDERED_ITEMS:
                    last = done and i == len(rows)
                    return Page(kept, "" if last else cursor_token(after, filter_text))
            if done:
                return Page(kept, "")
            chunk = min(2 * chunk, SCAN_CHUNK)

    def get(self, ctx: ApiContext, parent: Parent, rid: str) -> Json:
        ctx.refresh()
        with ctx.unit() as uow:
            scope = Scope(ctx, uow, parent)
            shown = self.render(scope, self._found(scope, rid))
        if shown is None:
            raise ApiError("NOT_FOUND", f"{rid} is gone")  # deleted while it was read
        return shown

    def cancel(self, ctx: ApiContext, parent: Parent, rid: str) -> Json:
        """Stop the resource (as google.protobuf.Empty): the work winds down after."""
        if self.stop is None:
            raise TypeError("this collection has no cancel")
        with ctx.unit() as uow:
            scope = Scope(ctx, uow, parent)
            self.stop(scope, rid, self._found(scope, rid))
        return {}

    def _found(self, scope: Scope, rid: str) -> T:
        if self.find is None:
            raise TypeError("this collection has no get")
        return self.find(scope, rid)

    # ------------------------------------------------------------ handlers (routes.ROUTES)

    def serve_create(self, call: Call) -> Json:
        if self.create is None:
            raise TypeError("this collection has no create")
        request = request_id(call.arg(REQUEST_ID))
        chosen = call.arg(self.id_param) or None
        generated = None if request is None else requested_id(self.id_param, call.parent,
                                                              request)
        try:
            return self.create(call.ctx, call.parent, call.body(), chosen, generated)
        except ApiError as exc:
            if chosen is not None or request is None or exc.status != "ALREADY_EXISTS":
                raise
            raise ApiError("ALREADY_EXISTS", f"{REQUEST_ID} {request}: {exc.message}: an "
                           "earlier create sent this requestId with another body; send the "
                           "same body to get what it made, or a new requestId for a new "
                           "resource", [FieldViolation(REQUEST_ID, "was used for another "
                                                       "request")]) from exc

    def serve_list(self, call: Call, owner: str = "") -> Json:
        return self.list_page(call.ctx, call.parent, filter_text=call.arg("filter"),
                              size=call.arg("pageSize"), token=call.arg("pageToken"),
                              owner=owner)

    def serve_get(self, call: Call) -> Json:
        return self.get(call.ctx, call.parent, call.rid)

    def serve_delete(self, call: Call) -> Json:
        if self.remove is None:
            raise TypeError("this collection has no delete")
        return self.remove(call.ctx, call.parent, call.rid)

    def serve_cancel(self, call: Call) -> Json:
        call.body(required=False)  # checked, though the name is all it needs
        return self.cancel(call.ctx, call.parent, call.rid)


# ---------------------------------------------------------------- what creates share


def new_id() -> str:
    """A generated resource id: a number of 18 digits, as Vertex's are."""
    return f"{uuid.uuid4().int % 10**18:018d}"


REQUEST_ID = "requestId"


def request_id(value: str | None) -> str | None:
    """A create's ``requestId``, lowercased (None: not given); it is a UUID, as AIP-155
    has it, or a 400 naming it."""
    if not value:
        return None
    if not names.REQUEST_ID.fullmatch(value):  # match: "$" lets a trailing newline by
        shown = value if len(value) <= 40 else f"{value[:40]}..."
        raise invalid(REQUEST_ID, f"must be a UUID (8-4-4-4-12 hexadecimal digits, e.g. "
                      f"{uuid.uuid4()}); got {shown!r}")
    return value.lower()


def requested_id(id_param: str, parent: Parent, request: str) -> str:
    """The id a create with ``requestId`` makes when the client names none: a number as
    ``new_id``'s are, but a function of (the collection, the parent, the request id). A
    retry names the same resource, so the create's own check (``prior_create``) answers it
    with what the first one made, in the store and in the create's transaction: nothing to
    record beside the resource, it outlives a restart, and another project's same request
    id names another resource."""
    digest = hashlib.sha256(f"{id_param}\n{parent.name}\n{request}".encode()).digest()
    return f"{int.from_bytes(digest[:16], 'big') % 10**18:018d}"


def require_cluster(uow: Any, parent: Parent, cluster_id: str, field: str) -> str:
    """The cluster a resource runs on exists under its parent (a 400 naming ``field``
    otherwise: the caller's reference is wrong, not the server); returns its domain id."""
    cluster = find_record(uow, "cluster", cluster_id, parent)
    if cluster is None:
        raise invalid(field, f"no cluster {cluster_id!r} in {parent.name}")
    return ids.domain_of(cluster)


def prior_create(uow: Any, kind: str, resource_id: str, parent: Parent, name: str,
                 resource: dict[str, Any], now: float) -> dict[str, Any] | None:
    """The record of a create with this id that came before (a retry of it, with the same
    body: it answers what the first made), or None; another body is ALREADY_EXISTS."""
    existing = uow.record(RESOURCES, resource_key(
        kind, create_id(uow, kind, resource_id, parent, now)))
    if existing is not None and (existing["parent"] != parent.name
                                 or existing["resource"] != resource):
        raise ApiError("ALREADY_EXISTS", f"{name} already exists with a different body")
    return existing  # type: ignore[no-any-return]
