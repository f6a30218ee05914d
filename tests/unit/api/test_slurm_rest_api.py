"""The Slurm Job API (``:callSlurmRestApi``) at the Flask level: who may call it, what input it
refuses (naming the field, reaching nothing), and that the JWT stays on the server.

slurmrestd itself is exercised for real in tests/integration/slurm/test_slurm_rest_api.py;
here a local HTTP stand-in records what the proxy sends, so a test can assert that a refused
call sent nothing and that the token only went to slurmrestd.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
from flask.testing import FlaskClient

from services.api.errors import ApiError
from services.api.http import create_app
from services.api.slurm_rest import CachedToken, SlurmRestConfig, checked_path, forward
from services.wiring.api import embedded_api
from services.wiring.embedded import embedded
from tests.serving import PARENT, cluster_body

TOKEN = "unit-admin"
JWT = "eyJ.secret-jwt.sig"
CALL = f"/v1beta1/{PARENT}/modelDevelopmentClusters/c1:callSlurmRestApi"


class StandIn(BaseHTTPRequestHandler):
    seen: ClassVar[list[dict[str, Any]]] = []

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length).decode() if length else ""
        StandIn.seen.append({"method": self.command, "path": self.path, "body": body,
                             "token": self.headers.get("X-SLURM-USER-TOKEN"),
                             "user": self.headers.get("X-SLURM-USER-NAME")})
        status = 404 if self.path.endswith("/job/999") else 200
        out = json.dumps({"errors": [], "echo": self.path}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    do_GET = do_POST = do_DELETE = _answer

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    StandIn.seen = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), StandIn)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def api(tmp_path: Path, server: str) -> Iterator[tuple[FlaskClient, Any, list[str]]]:
    app = embedded(tmp_path / "state")
    ctx, auth = embedded_api(app, env_token=TOKEN)
    minted: list[str] = []

    def mint(user: str, lifespan: int) -> str:
        minted.append(user)
        return JWT

    ctx.slurm_rest = SlurmRestConfig({}, server, "alice", CachedToken(mint, "alice"))
    client = create_app(ctx).test_client()
    resp = client.post(f"/v1beta1/{PARENT}/modelDevelopmentClusters?modelDevelopmentClusterId=c1",
                       json=cluster_body(), headers={"Authorization": f"Bearer {TOKEN}"})
    assert resp.status_code == 200, resp.json
    yield client, auth, minted
    app.compute.kill_all()
    app.close()


def _call(client: FlaskClient, body: Any, token: str = TOKEN, url: str = CALL) -> Any:
    return client.post(url, json=body, headers={"Authorization": f"Bearer {token}"})


def test_get_and_post_reach_slurmrestd_with_the_servers_jwt_only(api: Any) -> None:
    client, _, minted = api
    resp = _call(client, {"method": "HTTP_METHOD_GET", "path": "/slurm/v0.0.38/jobs"})
    assert resp.status_code == 200, resp.json
    assert resp.json == {"status": 200, "structuredBody": {"errors": [], "echo": "/slurm/v0.0.38/jobs"}}
    job = {"script": "#!/bin/bash\ntrue\n", "job": {"name": "x"}}
    resp = _call(client, {"method": "HTTP_METHOD_POST", "path": "/slurm/v0.0.38/job/submit",
                          "body": json.dumps(job)})
    assert resp.status_code == 200 and resp.json["status"] == 200
    resp = _call(client, {"method": "HTTP_METHOD_DELETE", "path": "/slurm/v0.0.38/job/999"})
    assert resp.status_code == 200 and resp.json["status"] == 404  # slurmrestd's own answer
    assert [(s["method"], s["path"]) for s in StandIn.seen] == [
        ("GET", "/slurm/v0.0.38/jobs"), ("POST", "/slurm/v0.0.38/job/submit"),
        ("DELETE", "/slurm/v0.0.38/job/999")]
    assert json.loads(StandIn.seen[1]["body"]) == job
    assert {s["token"] for s in StandIn.seen} == {JWT} and {s["user"] for s in StandIn.seen} == {"alice"}
    assert minted == ["alice"]  # minted once, cached
    assert JWT not in resp.get_data(as_text=True)


@pytest.mark.parametrize("path", [
    "/etc/passwd", "/slurm/v0.0.38/../../openapi", "/slurm/v0.0.38//jobs", "/slurmdb/v0.0.38/jobs",
    "/slurm/v0.0.39/jobs", "/slurm/v0.0.38/jobs?update_time=1", "http://evil/slurm/v0.0.38/jobs",
    "/slurm/v0.0.38/job/1/..", "slurm/v0.0.38/jobs", "/slurm/v0.0.38/jo bs",
])
def test_paths_outside_the_slurm_api_are_refused_naming_path(api: Any, path: str) -> None:
    client, _, minted = api
    resp = _call(client, {"method": "HTTP_METHOD_GET", "path": path})
    assert resp.status_code == 400, resp.json
    assert resp.json["error"]["status"] == "INVALID_ARGUMENT"
    fields = [v["field"] for d in resp.json["error"]["details"] for v in d.get("fieldViolations", [])]
    assert fields == ["path"], resp.json
    assert StandIn.seen == [] and minted == []  # refused before anything was sent or minted


@pytest.mark.parametrize(("body", "field"), [
    ({"method": "HTTP_METHOD_PUT", "path": "/slurm/v0.0.38/jobs"}, "method"),
    ({"method": "GET", "path": "/slurm/v0.0.38/jobs"}, "method"),
    ({"path": "/slurm/v0.0.38/jobs"}, "method"),
    ({"method": "HTTP_METHOD_GET"}, "path"),
    ({"method": "HTTP_METHOD_GET", "path": "/slurm/v0.0.38/jobs", "body": "{}x"}, "body"),
    ({"method": "HTTP_METHOD_GET", "path": "/slurm/v0.0.38/jobs", "body": {"a": 1}}, "body"),
    ({"method": "HTTP_METHOD_POST", "path": "/slurm/v0.0.38/job/submit", "body": "[1]"}, "body"),
    ({"method": "HTTP_METHOD_POST", "path": "/slurm/v0.0.38/job/submit", "body": "not json"}, "body"),
    ({"method": "HTTP_METHOD_GET", "path": "/slurm/v0.0.38/jobs", "shell": "rm -rf /"}, "shell"),
])
def test_bad_input_is_a_400_naming_the_field_and_sends_nothing(api: Any, body: Any, field: str) -> None:
    client, _, _ = api
    resp = _call(client, body)
    assert resp.status_code == 400, resp.json
    fields = [v["field"] for d in resp.json["error"]["details"] for v in d.get("fieldViolations", [])]
    assert fields and fields[0] == field, resp.json
    assert StandIn.seen == []


def test_a_viewer_gets_403_naming_the_permission_and_nothing_is_sent(api: Any) -> None:
    client, auth, _ = api
    viewer = auth.tokens.create("token:viewer", "viewer")
    resp = _call(client, {"method": "HTTP_METHOD_GET", "path": "/slurm/v0.0.38/jobs"}, token=viewer)
    assert resp.status_code == 403, resp.json
    assert "aiplatform.modelDevelopmentClusters.run" in resp.json["error"]["message"]
    editor = auth.tokens.create("token:editor", "editor")
    resp = _call(client, {"method": "HTTP_METHOD_GET", "path": "/slurm/v0.0.38/ping"}, token=editor)
    assert resp.status_code == 200 and resp.json["status"] == 200
    assert [s["path"] for s in StandIn.seen] == ["/slurm/v0.0.38/ping"]


def test_no_token_is_401_and_an_unknown_cluster_is_404(api: Any) -> None:
    client, _, _ = api
    resp = client.post(CALL, json={"method": "HTTP_METHOD_GET", "path": "/slurm/v0.0.38/jobs"})
    assert resp.status_code == 401
    resp = _call(client, {"method": "HTTP_METHOD_GET", "path": "/slurm/v0.0.38/jobs"},
                 url=CALL.replace("/c1:", "/nope:"))
    assert resp.status_code == 404, resp.json
    assert StandIn.seen == []


def test_without_a_configured_slurmrestd_it_is_failed_precondition(tmp_path: Path) -> None:
    app = embedded(tmp_path / "state")
    try:
        ctx, _ = embedded_api(app, env_token=TOKEN)
        ctx.slurm_rest = SlurmRestConfig({}, None, "alice", CachedToken(lambda u, s: JWT, "alice"))
        client = create_app(ctx).test_client()
        client.post(f"/v1beta1/{PARENT}/modelDevelopmentClusters?modelDevelopmentClusterId=c1",
                    json=cluster_body(), headers={"Authorization": f"Bearer {TOKEN}"})
        resp = _call(client, {"method": "HTTP_METHOD_GET", "path": "/slurm/v0.0.38/jobs"})
        assert resp.status_code == 400 and resp.json["error"]["status"] == "FAILED_PRECONDITION"
        assert "MTC_SLURMRESTD_URL" in resp.json["error"]["message"]
    finally:
        app.compute.kill_all()
        app.close()


def test_an_unreachable_slurmrestd_is_503_without_the_token() -> None:
    cfg = SlurmRestConfig({"c1": "http://127.0.0.1:9"}, None, "alice",
                          CachedToken(lambda u, s: JWT, "alice"))
    target = cfg.target("c1")
    assert target is not None
    with pytest.raises(ApiError) as err:
        forward(target, "GET", "/slurm/v0.0.38/jobs", None, timeout_s=2.0)
    assert err.value.status == "UNAVAILABLE" and JWT not in str(err.value)


def test_checked_path_keeps_good_paths() -> None:
    for path in ("/slurm/v0.0.38/jobs", "/slurm/v0.0.38/job/submit", "/slurm/v0.0.38/job/12",
                 "/slurm/v0.0.38/nodes/", "/slurm/v0.0.38/partition/mtc"):
        assert checked_path(path, "v0.0.38") == path


def test_config_from_env_reads_per_cluster_urls_and_refuses_garbage() -> None:
    cfg = SlurmRestConfig.from_env({"MTC_SLURMRESTD_URLS": '{"a": "http://127.0.0.1:1"}',
                                    "MTC_SLURMRESTD_URL": "http://127.0.0.1:2",
                                    "MTC_SLURMRESTD_USER": "bob"})
    a, b = cfg.target("a"), cfg.target("b")
    assert a is not None and a.url == "http://127.0.0.1:1" and a.user == "bob"
    assert b is not None and b.url == "http://127.0.0.1:2"
    with pytest.raises(ValueError, match="MTC_SLURMRESTD_URLS"):
        SlurmRestConfig.from_env({"MTC_SLURMRESTD_URLS": "[1]"})
    bad = SlurmRestConfig.from_env({"MTC_SLURMRESTD_URL": "http://h:1/path?x"})
    with pytest.raises(Exception, match="not an http"):
        bad.target("x")
