"""The OpenAPI document: one operation per route and version, schemas from the wire models,
every $ref resolvable, errors as google.rpc.Status, bearer auth everywhere."""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import pytest

from services.api.http import ROUTES
from services.api.openapi import ERROR_STATUSES, document, templates

DOC = document(ROUTES)
JOBS = "/v1/projects/{project}/locations/{location}/customJobs"
CLUSTERS = "/v1beta1/projects/{project}/locations/{location}/modelDevelopmentClusters"


def _operations() -> list[tuple[str, str, dict[str, Any]]]:
    return [(m, p, op) for p, item in DOC["paths"].items() for m, op in item.items()
            if m != "parameters"]


def test_every_route_and_version_is_one_operation() -> None:
    expected = {(r.method.lower(), path) for r in ROUTES
                for _, path in templates(r.pattern.pattern)}
    assert {(m, p) for m, p, _ in _operations()} == expected
    # customJobs, clusters, operations; nodes/{node}:reportHealth; models and trainingPipelines;
    # hyperparameterTuningJobs; customJobs/{id}/logs; the four node operator verbs;
    # the Slurm Job API and reportFaultyNodes (v1beta1 only); the cluster's triagePolicy
    # and its four commands (v1beta1 only); endpoints (ten routes, both versions) and the
    # operation's get at /ui/ (the SDK's operations client polls it there); rolloutSoftware
    # (v1beta1 only)
    assert len(expected) == 26 + 1 + 22 + 10 + 2 + 4 + 1 + 1 + 5 + 20 + 1 + 1
    ids = [op["operationId"] for _, _, op in _operations()]
    assert len(ids) == len(set(ids))
    assert "v1beta1.customJobs.create" in ids and "v1.customJobs.create" in ids


def test_paths_name_their_parameters_by_resource() -> None:
    assert f"{JOBS}/{{customJob}}:cancel" in DOC["paths"]
    assert f"{CLUSTERS}/{{modelDevelopmentCluster}}/nodes" in DOC["paths"]
    assert "/v1/projects/{project}/locations/{location}/operations/{operation}:wait" \
        in DOC["paths"]
    for path, item in DOC["paths"].items():
        names = [p["name"] for p in item["parameters"]]
        assert names == re.findall(r"\{(\w+)\}", path)
        assert all(p["in"] == "path" and p["required"] for p in item["parameters"])


def test_a_route_openapi_cannot_express_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot express"):
        templates(r"/v1/(?P<x>a|b)+/things")


def test_bodies_answers_and_errors() -> None:
    paths = DOC["paths"]
    create = paths[JOBS]["post"]
    assert create["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/CustomJob"}
    assert [p["name"] for p in create["parameters"]] == ["customJobId", "requestId"]
    listing = paths[JOBS]["get"]
    assert [p["name"] for p in listing["parameters"]] == ["pageSize", "pageToken", "filter"]
    ok = listing["responses"]["200"]["content"]["application/json"]["schema"]
    assert ok == {"$ref": "#/components/schemas/ListCustomJobsResponse"}
    cluster_create = paths[CLUSTERS]["post"]
    assert cluster_create["parameters"][0]["name"] == "modelDevelopmentClusterId"
    assert cluster_create["parameters"][0]["required"] is True
    cancel = paths[f"{JOBS}/{{customJob}}:cancel"]["post"]
    assert cancel["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Empty"}
    for _, _, op in _operations():
        codes = set(op["responses"])
        assert codes == {"200", "default", *map(str, ERROR_STATUSES)}
        assert op["responses"]["404"]["content"]["application/json"]["schema"] == {
            "$ref": "#/components/schemas/Status"}


def test_every_ref_resolves_and_bounds_are_json_schema_keywords() -> None:
    text = json.dumps(DOC)
    for ref in set(re.findall(r'"\$ref": "#/components/schemas/([^"]+)"', text)):
        assert ref in DOC["components"]["schemas"], ref
    assert '"ge":' not in text and '"le":' not in text
    replicas = DOC["components"]["schemas"]["WorkerPoolSpec"]["properties"]["replicaCount"]
    integer = next(b for b in replicas["anyOf"][0]["oneOf"] if b["type"] == "integer")
    assert (integer["minimum"], integer["maximum"]) == (0, 100_000)


def test_an_error_body_matches_the_status_schema() -> None:
    from services.api.errors import invalid

    schema = {**DOC["components"]["schemas"]["Status"],
              "components": DOC["components"]}
    jsonschema.validate(invalid("pageSize", "must not be negative").body(), schema)


def test_bearer_auth_applies_to_every_operation() -> None:
    assert DOC["security"] == [{"bearerAuth": []}]
    assert DOC["components"]["securitySchemes"]["bearerAuth"] == {
        "type": "http", "scheme": "bearer"}
    assert DOC["openapi"].startswith("3.1")


def test_report_faulty_nodes_is_described_as_served() -> None:
    op = DOC["paths"][f"{CLUSTERS}/{{modelDevelopmentCluster}}:reportFaultyNodes"]["post"]
    body = op["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/ReportFaultyNodesRequest"}
    assert op["requestBody"]["required"] is True
    assert op["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Operation"}
    schema = {**body, "components": DOC["components"]}
    host = {"faultReasons": [{"behavior": "UNRECOVERABLE_GPU_ERROR", "description": "Xid 79"}]}
    jsonschema.validate({"nodeActions": [{"nodeId": "c1-gpu-0"}]}, schema)
    jsonschema.validate({"nodeActions": [{"nodeId": "c1-gpu-0", "reportFaultyHost": host}]},
                        schema)
    for bad in ({}, {"nodeActions": []},
                {"nodeActions": [{"nodeId": "n", "reportFaultyHost": {
                    "faultReasons": [{"behavior": "SLOW"}]}}]}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
