"""Edges the schemathesis run (and probing around what it found) turned up: each was a 5xx
or a non-JSON answer; each is now a google.rpc.Status naming what was wrong."""

from __future__ import annotations

import base64
import json
from typing import Any

from tests.serving import PARENT
from tests.unit.api.conftest import Api

JOBS = f"/v1/{PARENT}/customJobs"


def _violations(resp: Any) -> list[str]:
    assert resp.content_type == "application/json", resp.get_data(as_text=True)
    return [v["field"] for d in resp.json["error"].get("details", [])
            for v in d.get("fieldViolations", [])]


def test_a_newline_in_a_path_segment_is_the_apis_400_not_flasks_html_404(api: Api) -> None:
    # werkzeug's path converter matches no newline: Flask answered its own text/html 404;
    # and "p\n" passed the project check, whose "$" lets a trailing newline by
    for project in ("p%0A", "%05%0Ap"):
        resp = api.call("GET", f"/v1/projects/{project}/locations/l/customJobs")
        assert resp.status_code == 400, resp.get_data(as_text=True)
        assert _violations(resp) == ["parent"]
    resp = api.call("GET", f"{JOBS}/a%0Ab")
    assert resp.status_code == 404 and resp.json["error"]["status"] == "NOT_FOUND"


def test_a_trailing_newline_is_refused_in_ids_and_output_uris(api: Api) -> None:
    body: dict[str, Any] = {"displayName": "j", "jobSpec": {"persistentResourceId": "c1"}}
    resp = api.call("POST", JOBS, body, query_string={"customJobId": "job\n"})
    assert resp.status_code == 400 and _violations(resp) == ["customJobId"]
    resp = api.call("POST", f"/v1beta1/{PARENT}/modelDevelopmentClusters", {},
                    query_string={"modelDevelopmentClusterId": "c1\n"})
    assert resp.status_code == 400 and _violations(resp) == ["modelDevelopmentClusterId"]
    body["jobSpec"]["baseOutputDirectory"] = {"outputUriPrefix": "gs://bucket/out\n"}
    resp = api.call("POST", JOBS, body)
    assert resp.status_code == 400
    assert _violations(resp) == ["jobSpec.baseOutputDirectory.outputUriPrefix"]


def test_a_method_flask_refuses_is_a_status_body_too(api: Api) -> None:
    resp = api.call("TRACE", JOBS)
    assert resp.status_code == 405
    assert resp.content_type == "application/json"
    assert resp.json["error"]["status"] == "UNIMPLEMENTED"


def test_a_filter_string_with_a_bad_escape_is_a_400_naming_filter(api: Api) -> None:
    for text in ('state="\\q"', 'displayName="\\u12"'):
        resp = api.call("GET", JOBS, query_string={"filter": text})
        assert resp.status_code == 400, (text, resp.json)
        assert _violations(resp) == ["filter"]
    ops = api.call("GET", f"/v1/{PARENT}/operations", query_string={"filter": 'done="\\x"'})
    assert ops.status_code == 400 and _violations(ops) == ["filter"]


def test_a_page_token_with_an_infinite_offset_is_a_400_naming_page_token(api: Api) -> None:
    token = base64.urlsafe_b64encode(b'{"o": 1e999, "f": "x"}').decode()
    resp = api.call("GET", JOBS, query_string={"pageToken": token})
    assert resp.status_code == 400, resp.json
    assert _violations(resp) == ["pageToken"]


def test_a_body_with_a_huge_integer_is_a_400_naming_the_body(api: Api) -> None:
    # json.loads raises a plain ValueError past 4300 digits, not a JSONDecodeError
    raw = '{"displayName": ' + "1" * 5000 + "}"
    resp = api.client.post(JOBS, data=raw, content_type="application/json",
                           headers={"Authorization": "Bearer unit-admin"})
    assert resp.status_code == 400, resp.get_data(as_text=True)
    assert _violations(resp) == ["(body)"]
    assert "4300" in json.loads(resp.get_data(as_text=True))["error"]["message"]


def test_the_served_document_is_the_generated_one(api: Api) -> None:
    from services.api.http import ROUTES
    from services.api.openapi import document

    resp = api.client.get("/openapi.json")
    assert resp.status_code == 200
    assert json.loads(resp.get_data(as_text=True)) == document(ROUTES)


def _busy_store(monkeypatch: Any, collection: str, times: int) -> list[int]:
    """The store refuses the next ``times`` reads of ``collection`` as Firestore does when a
    concurrent transaction holds their lock (a TransientError); returns a counter."""
    from shared.adapters.sqlite_store import SqliteTransaction
    from shared.domain.errors import TransientError

    refused = [0]
    get, query = SqliteTransaction.get, SqliteTransaction.query

    def refuse(name: str) -> None:
        if name == collection and refused[0] < times:
            refused[0] += 1
            raise TransientError(f"concurrent transaction held {name}: 409 lock timeout")

    def busy_get(self: Any, name: str, doc_id: str) -> dict[str, Any] | None:
        refuse(name)
        return get(self, name, doc_id)

    def busy_query(self: Any, name: str, equals: dict[str, Any]) -> list[dict[str, Any]]:
        refuse(name)
        return query(self, name, equals)

    monkeypatch.setattr(SqliteTransaction, "get", busy_get)
    monkeypatch.setattr(SqliteTransaction, "query", busy_query)
    return refused


def test_a_read_that_meets_a_busy_store_is_retried_not_a_500(api: Api, monkeypatch: Any
                                                             ) -> None:
    """Seen on the emulator stack: a GET of a cluster's nodes waited on a handler's
    transaction, Firestore aborted the read, and the API answered 500 INTERNAL."""
    api.cluster("c1")
    refused = _busy_store(monkeypatch, "nodes", 2)
    resp = api.call("GET", f"/v1beta1/{PARENT}/modelDevelopmentClusters/c1/nodes")
    assert resp.status_code == 200, resp.json
    assert refused[0] == 2 and len(resp.json["nodes"]) >= 2


def test_a_store_that_stays_busy_is_503_unavailable_and_changes_nothing(
        api: Api, monkeypatch: Any) -> None:
    api.cluster("c1")
    cluster = f"/v1beta1/{PARENT}/modelDevelopmentClusters/c1"
    refused = _busy_store(monkeypatch, "nodes", 1_000)
    resp = api.call("GET", f"{cluster}/nodes")
    assert resp.status_code == 503 and resp.json["error"]["status"] == "UNAVAILABLE"
    assert resp.headers["Retry-After"] == "1" and refused[0] == 5  # the read and 4 retries
    # a write is not retried (a commit that timed out may have landed): one try, then 503
    monkeypatch.undo()
    refused = _busy_store(monkeypatch, "clusters", 1_000)
    resp = api.call("DELETE", cluster)
    assert resp.status_code == 503 and resp.json["error"]["status"] == "UNAVAILABLE"
    assert refused[0] == 1
    monkeypatch.undo()
    assert api.call("GET", cluster).json["state"] == "READY"
