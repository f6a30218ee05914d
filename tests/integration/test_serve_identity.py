"""The Server header of `mtc serve` names no software version (it said
Werkzeug's and Python's)."""

from __future__ import annotations

from pathlib import Path

import requests

from tests.serving import mtc_serve

TOKEN = "identity-token"


def test_defect_9_server_header_names_no_versions(tmp_path: Path) -> None:
    with mtc_serve(tmp_path / "state", TOKEN) as url:
        answers = [requests.get(f"{url}/healthz", timeout=10),
                   requests.get(f"{url}/v1beta1/projects/p/locations/l/customJobs", timeout=10),
                   requests.get(f"{url}/no/such/path", timeout=10)]
    for resp in answers:
        server = resp.headers.get("Server", "")
        assert server == "mtc", (resp.url, server)
        assert "Python" not in str(resp.headers) and "Werkzeug" not in str(resp.headers)
