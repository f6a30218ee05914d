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
