"""A :wait holds a request thread for up to its timeout, so
waiting clients (a viewer's included) could take every thread of ``mtc serve`` from the calls
that change things. At most ``wait_slots`` waits hold a thread at once; another answers at
once with the operation as it is (AIP-151 lets a server return early)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace

from flask.testing import FlaskClient

from services.api.http import create_app
from services.wiring.api import embedded_api
from services.wiring.embedded import embedded
from tests.serving import PARENT, cluster_body
from tests.unit.api.conftest import AUTH, TOKEN, one_pass_config


def test_defect_4_waits_beyond_the_slots_answer_at_once(tmp_path: Path) -> None:
    app = embedded(tmp_path / "state", config=one_pass_config())
    ctx, _ = embedded_api(app, env_token=TOKEN)
    # the control plane never moves here (nothing delivered): the operation stays not done
    ctx.runtime = SimpleNamespace(deps=app.deps, after_request=lambda: None)  # type: ignore[assignment]
    ctx.wait_slots = threading.BoundedSemaphore(1)
    ctx.max_wait_s = 3.0
    flask_app = create_app(ctx)
    try:
        client: FlaskClient = flask_app.test_client()
        made = client.post(f"/v1beta1/{PARENT}/modelDevelopmentClusters?modelDevelopmentClusterId=c1",
                           json=cluster_body(), headers=AUTH)
        assert made.status_code == 200, made.json
        op = made.json["name"]
        held = threading.Event()
        first: dict[str, float] = {}

        def long_wait() -> None:
            started = time.monotonic()
            held.set()
            flask_app.test_client().post(f"/v1beta1/{op}:wait", json={"timeout": "3s"},
                                         headers=AUTH)
            first["s"] = time.monotonic() - started

        waiter = threading.Thread(target=long_wait)
        waiter.start()
        held.wait()
        time.sleep(0.3)  # the first wait holds the one slot
        started = time.monotonic()
        second = client.post(f"/v1beta1/{op}:wait", json={"timeout": "3s"}, headers=AUTH)
        quick = time.monotonic() - started
        waiter.join()
        assert second.status_code == 200 and second.json["done"] is False, second.json
        assert quick < 1.0 < first["s"], (quick, first)
    finally:
        app.compute.kill_all()
        app.close()
