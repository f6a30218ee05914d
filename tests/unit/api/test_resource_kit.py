"""The API resource kit on its own: a Collection's list, get and cancel over a stub resource,
the route table's shape, and the body checks (no control plane, no compute)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

import flask
import pytest

from services.api.bodies import MAX_DEPTH, read_body
from services.api.call import Call
from services.api.collection import Collection, Scope
from services.api.context import ApiContext
from services.api.errors import ApiError
from services.api.names import Parent
from services.api.paging import paginate
from services.api.routes import ROUTES
from services.api.wire.operation import ListOperationsResponse, Operation

PARENT = Parent("p", "l")


class _Ctx:
    """What a Collection asks of its context: refresh, and a unit of work."""

    def __init__(self) -> None:
        self.refreshed = 0
        self.units = 0

    def refresh(self) -> None:
        self.refreshed += 1

    @contextmanager
    def unit(self) -> Iterator[Any]:
        self.units += 1
        yield None


class _Ops:
    """A stub resource: operations named op-0 ... op-N, every third done."""

    def __init__(self, count: int) -> None:
        self.records = [{"id": f"op-{i}", "done": i % 3 == 0} for i in range(count)]
        self.rendered: list[str] = []
        self.stopped: list[str] = []

    def load(self, scope: Scope) -> list[dict[str, Any]]:
        return self.records

    def render(self, scope: Scope, record: dict[str, Any]) -> dict[str, Any]:
        self.rendered.append(record["id"])
        return {"name": f"{scope.parent.name}/operations/{record['id']}",
                "done": record["done"]}

    def find(self, scope: Scope, rid: str) -> dict[str, Any]:
        for record in self.records:
            if record["id"] == rid:
                return record
        raise ApiError("NOT_FOUND", rid)

    def stop(self, scope: Scope, rid: str, record: dict[str, Any]) -> None:
        self.stopped.append(rid)

    def collection(self) -> Collection[dict[str, Any]]:
        return Collection(ListOperationsResponse, "operations", Operation, load=self.load,
                          render=self.render, filterable=("done",),
                          field=lambda item, name: str(item.get(name, False)).lower(),
                          find=self.find, stop=self.stop)


def _ctx() -> tuple[_Ctx, ApiContext]:
    ctx = _Ctx()
    return ctx, cast(ApiContext, ctx)


def test_a_list_without_a_filter_renders_only_its_page_with_the_usual_tokens() -> None:
    ops = _Ops(7)
    stub, ctx = _ctx()
    first = ops.collection().list_page(ctx, PARENT, size="3")
    assert [o["name"].rsplit("/", 1)[1] for o in first["operations"]] == ["op-0", "op-1", "op-2"]
    assert ops.rendered == ["op-0", "op-1", "op-2"]
    assert first["nextPageToken"] == paginate(list(range(7)), size=3, token=None).next_page_token
    second = ops.collection().list_page(ctx, PARENT, size="3", token=first["nextPageToken"])
    assert [o["name"][-4:] for o in second["operations"]] == ["op-3", "op-4", "op-5"]
    assert stub.refreshed == stub.units == 2


def test_a_filter_matches_the_rendered_resource_and_pages_what_it_kept() -> None:
    ops = _Ops(10)
    _, ctx = _ctx()
    out = ops.collection().list_page(ctx, PARENT, filter_text="done=true", size="2")
    assert [o["name"][-4:] for o in out["operations"]] == ["op-0", "op-3"]
    rest = ops.collection().list_page(ctx, PARENT, filter_text="done=true", size="2",
                                      token=out["nextPageToken"])
    assert [o["name"][-4:] for o in rest["operations"]] == ["op-6", "op-9"]
    assert rest["nextPageToken"] == ""
    with pytest.raises(ApiError) as exc:  # a token is good only for the filter it came with
        ops.collection().list_page(ctx, PARENT, filter_text="done=false",
                                   token=out["nextPageToken"])
    assert [v.field for v in exc.value.violations] == ["pageToken"]


@pytest.mark.parametrize(("query", "field"), [({"filter_text": "state=x"}, "filter"),
                                              ({"size": "-1"}, "pageSize")])
def test_a_bad_filter_or_page_size_is_refused_before_the_store_is_read(
        query: dict[str, str], field: str) -> None:
    stub, ctx = _ctx()
    with pytest.raises(ApiError) as exc:
        _Ops(1).collection().list_page(ctx, PARENT, **query)
    assert [v.field for v in exc.value.violations] == [field]
    assert stub.units == 0


def test_get_renders_what_find_found_and_cancel_stops_it() -> None:
    ops = _Ops(3)
    _, ctx = _ctx()
    kit = ops.collection()
    assert kit.get(ctx, PARENT, "op-1") == {"name": "projects/p/locations/l/operations/op-1",
                                            "done": False}
    assert kit.cancel(ctx, PARENT, "op-2") == {}
    assert ops.stopped == ["op-2"]
    with pytest.raises(ApiError):
        kit.cancel(ctx, PARENT, "op-9")
    assert ops.stopped == ["op-2"]


def test_a_collection_without_get_or_cancel_says_so() -> None:
    _, ctx = _ctx()
    kit: Collection[Any] = Collection(ListOperationsResponse, "operations", Operation,
                                      load=lambda s: [], render=lambda s, r: r)
    with pytest.raises(TypeError):
        kit.get(ctx, PARENT, "x")
    with pytest.raises(TypeError):
        kit.cancel(ctx, PARENT, "x")


def test_the_route_table_is_one_style_and_has_no_shadowed_row() -> None:
    assert len(ROUTES) == 57  # with the triage policy's five, the endpoints' eleven, a rollout
    seen = set()
    for route in ROUTES:
        assert route.method in ("GET", "POST", "PATCH", "DELETE")
        assert callable(route.handler)
        assert route.permission.startswith(("aiplatform.", "mtc."))
        key = (route.method, route.pattern.pattern)
        assert key not in seen
        seen.add(key)
        # a wait and a prediction change nothing: not audited
        assert route.mutates == (route.method != "GET"
                                 and not route.permission.endswith((".wait", ".predict")))
    # the node operator's commands, a job's or study's cancel (the console asks why), and
    # the triage policy's commands
    assert [r.reasoned for r in ROUTES].count(True) == 10


def test_a_call_reads_flags_strictly() -> None:
    def call(**args: str) -> Call:
        return Call(cast(ApiContext, None), PARENT, {"rid": "r"}, args, lambda _: {}, "me")

    assert call(force="true").flag("force") and call(force="1").flag("force")
    assert not call().flag("force") and not call(force="FALSE").flag("force")
    with pytest.raises(ApiError) as exc:
        call(force="yes").flag("force")
    assert [v.field for v in exc.value.violations] == ["force"]
    assert call().rid == "r"


@pytest.mark.parametrize(("raw", "why"), [
    (b"", "a JSON object is required"),
    (b"[1]", "must be a JSON object"),
    (b"\xff", "is not UTF-8"),
    (b'{"a": "\\u0000"}', "NUL character in a string"),
    (json.dumps({"a": [[]] * 1}).replace("[]", "[" * MAX_DEPTH + "]" * MAX_DEPTH).encode(),
     f"deeper than {MAX_DEPTH}"),
])
def test_a_body_that_is_not_a_json_object_is_a_400_naming_the_body(raw: bytes, why: str
                                                                    ) -> None:
    request = flask.Flask("t").test_request_context("/", method="POST", data=raw)
    with request, pytest.raises(ApiError) as exc:
        read_body(flask.request)
    assert [v.field for v in exc.value.violations] == ["(body)"]
    assert why in exc.value.message


def test_an_absent_body_is_empty_where_it_is_optional() -> None:
    app = flask.Flask("t")
    with app.test_request_context("/", method="POST", data=b"  "):
        assert read_body(flask.request, required=False) == {}
