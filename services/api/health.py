"""``/healthz`` and ``/readyz``: a small WSGI dispatcher in front of the API, without a token.

``/healthz`` is liveness: the process answers. ``/readyz`` is readiness: every check answered
"ready" within its time; otherwise 503 with each check's answer, so an orchestrator (and a
person with curl) sees which one failed. A check that raises, hangs past ``timeout_s`` or
says anything but ready counts as not ready: "unknown" is never reported as ok.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

Check = Callable[[], "str | None"]  # None: ready; else why not
StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]

OK = "ok"
PATHS = ("/healthz", "/readyz")


class HealthEndpoints:
    """Wraps ``app``: the two paths are answered here, everything else goes to ``app``."""

    def __init__(self, app: WsgiApp, checks: Mapping[str, Check], *,
                 timeout_s: float = 2.0) -> None:
        self.app = app
        self.checks = dict(checks)
        self.timeout_s = timeout_s
        # checks run here, so a hung store costs a probe its timeout, not a request thread
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="mtc-readyz")

    def __call__(self, environ: dict[str, Any], start_response: StartResponse
                 ) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path not in PATHS:
            return self.app(environ, start_response)
        if environ.get("REQUEST_METHOD", "GET") not in ("GET", "HEAD"):
            return _answer(start_response, 405, {"status": "method not allowed"},
                           [("Allow", "GET, HEAD")])
        if path == "/healthz":
            return _answer(start_response, 200, {"status": OK})
        reasons = self.run_checks()
        ready = all(r is None for r in reasons.values())
        results = {name: OK if r is None else r for name, r in reasons.items()}
        return _answer(start_response, 200 if ready else 503,
                       {"status": OK if ready else "unavailable", "checks": results})

    def run_checks(self) -> dict[str, str | None]:
        """Each check's reason for not being ready (None: ready)."""
        futures = {name: self._pool.submit(check) for name, check in self.checks.items()}
        results: dict[str, str | None] = {}
        for name, future in futures.items():
            try:
                reason = future.result(timeout=self.timeout_s)
            except FutureTimeout:
                reason = f"no answer within {self.timeout_s:g} s"
            except Exception as exc:
                reason = f"{type(exc).__name__}: {exc}"
            results[name] = None if reason is None else (str(reason) or "not ready")
        return results

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _answer(start_response: StartResponse, status: int, body: dict[str, Any],
            headers: list[tuple[str, str]] | None = None) -> list[bytes]:
    data = json.dumps(body).encode()
    reason = {200: "OK", 405: "Method Not Allowed", 503: "Service Unavailable"}[status]
    start_response(f"{status} {reason}", [
        ("Content-Type", "application/json"), ("Content-Length", str(len(data))),
        ("Cache-Control", "no-store"), *(headers or [])])
    return [data]
