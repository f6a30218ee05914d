"""How the CLI reaches the API: in process on the local state directory, or over HTTP.

Both transports speak the same resource calls and return the same wire JSON (what the REST
API answers), so the commands and their tables do not know which one they have. Failures
are a ``ClientError`` either way: an ``ApiError`` raised in process, or the
``google.rpc.Status`` body a server answered with.
"""

from __future__ import annotations

import getpass
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import requests

from services.api import (
    clusters,
    custom_jobs,
    endpoints,
    faulty_nodes,
    node_ops,
    operations_api,
    rollouts,
    serving_router,
    triage_policy,
)
from services.api import job_logs as logs_api
from services.api import models as models_api
from services.api.context import ApiContext
from services.api.errors import CANONICAL, ApiError
from services.api.names import Parent
from services.wiring.api import EmbeddedApiRuntime, embedded_api
from services.wiring.embedded import EmbeddedApp

CODE_NAMES = {code: name for name, (_, code) in CANONICAL.items()} | {2: "UNKNOWN"}
BAD_REQUEST = "type.googleapis.com/google.rpc.BadRequest"
WAIT_SLICE_S = 5.0  # one :wait call waits at most this long: `mtc serve` answers one
# request at a time and only ticks the fleet between requests, so a long :wait would stall it
JOB_ENDED = frozenset({"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED"})
JOB_POLL_S = 1.0


@dataclass
class ClientError(Exception):
    """A call the API refused: canonical status name, message, field violations."""

    status: str
    message: str
    violations: list[tuple[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__init__(f"{self.status}: {self.message}")

    @classmethod
    def from_status(cls, status: dict[str, Any], name: str | None = None) -> ClientError:
        """From a google.rpc.Status (an error body's ``error``, or an Operation's)."""
        code = status.get("code")
        label = name or status.get("status") or CODE_NAMES.get(
            code if isinstance(code, int) else -1, "UNKNOWN")
        violations = [(str(v.get("field", "")), str(v.get("description", "")))
                      for d in status.get("details") or [] if isinstance(d, dict)
                      and d.get("@type") == BAD_REQUEST
                      for v in d.get("fieldViolations") or [] if isinstance(v, dict)]
        return cls(str(label), str(status.get("message", "")), violations)


class Client(Protocol):
    """The API calls the CLI makes; every one returns the wire JSON."""

    def create_cluster(self, parent: Parent, cluster_id: str, body: Any) -> dict[str, Any]: ...
    def update_cluster(self, parent: Parent, cluster_id: str, body: Any) -> dict[str, Any]: ...
    def get_cluster(self, parent: Parent, cluster_id: str) -> dict[str, Any]: ...
    def list_clusters(self, parent: Parent, filter_text: str | None = None
                      ) -> list[dict[str, Any]]: ...
    def delete_cluster(self, parent: Parent, cluster_id: str) -> dict[str, Any]: ...
    def cluster_nodes(self, parent: Parent, cluster_id: str) -> list[dict[str, Any]]: ...
    def create_job(self, parent: Parent, body: Any, job_id: str | None) -> dict[str, Any]: ...
    def get_job(self, parent: Parent, job_id: str) -> dict[str, Any]: ...
    def list_jobs(self, parent: Parent, filter_text: str | None = None
                  ) -> list[dict[str, Any]]: ...
    def cancel_job(self, parent: Parent, job_id: str) -> dict[str, Any]: ...
    def delete_job(self, parent: Parent, job_id: str) -> dict[str, Any]: ...
    def wait_operation(self, name: str, timeout_s: float) -> dict[str, Any]: ...
    def wait_job(self, parent: Parent, job_id: str, timeout_s: float) -> dict[str, Any]: ...
    def upload_model(self, parent: Parent, body: Any) -> dict[str, Any]: ...
    def get_model(self, parent: Parent, model_id: str) -> dict[str, Any]: ...
    def read_job_logs(self, parent: Parent, job_id: str, *, attempt: int | None = None,
                      rank: int | None = None, token: str | None = None) -> dict[str, Any]: ...
    def node_command(self, parent: Parent, cluster_id: str, node_id: str, verb: str,
                     reason: str) -> dict[str, Any]: ...
    def report_faulty_nodes(self, parent: Parent, cluster_id: str, body: Any
                            ) -> dict[str, Any]: ...
    def triage_policy(self, parent: Parent, cluster_id: str) -> dict[str, Any]: ...
    def triage_command(self, parent: Parent, cluster_id: str, verb: str, body: Any
                       ) -> dict[str, Any]: ...
    def endpoint_call(self, parent: Parent, method: str, tail: str, body: Any,
                      params: dict[str, str] | None) -> dict[str, Any]: ...
    def rollout_software(self, parent: Parent, cluster_id: str, body: Any
                         ) -> dict[str, Any]: ...


def operation_parent(name: str) -> tuple[Parent, str]:
    """``projects/P/locations/L/operations/ID`` -> (Parent(P, L), ID)."""
    parts = name.split("/")
    if len(parts) != 6 or parts[0] != "projects" or parts[2] != "locations" \
            or parts[4] != "operations":
        raise ClientError("INTERNAL", f"not an operation name: {name!r}")
    return Parent(parts[1], parts[3]), parts[5]


def _pages(fetch: Callable[[str | None], dict[str, Any]], key: str
           ) -> Iterator[dict[str, Any]]:
    token: str | None = None
    while True:
        page = fetch(token)
        yield from page.get(key, [])
        token = page.get("nextPageToken") or None
        if token is None:
            return


# ---------------------------------------------------------------- in process


class _CliRuntime(EmbeddedApiRuntime):
    """The embedded runtime, with a test hook between a command's commit and its delivery."""

    pause_before_pump: float = 0.0

    def after_request(self) -> None:
        if self.pause_before_pump:  # said first: a test kills the command once it reads this
            print("mtc: committed; pausing before delivery", file=sys.stderr, flush=True)
            time.sleep(self.pause_before_pump)
        super().after_request()


class LocalClient:
    """The resource functions of ``services.api``, called in process on ``app``'s state.

    Whoever can open the state directory owns it, so no token is checked; changes are still
    written to the audit log, as ``local:<user>``.
    """

    def __init__(self, app: EmbeddedApp, *, pause_before_pump: float = 0.0) -> None:
        ctx, _auth = embedded_api(app)
        runtime = _CliRuntime(app)
        runtime.pause_before_pump = pause_before_pump
        self.app = app
        self.ctx: ApiContext = replace(ctx, runtime=runtime)
        self.principal = f"local:{_user()}"

    def _call(self, fn: Callable[[], dict[str, Any]], *, permission: str = "",
              resource: str = "", method: str = "", reason: str = "") -> dict[str, Any]:
        status = 200
        try:
            return fn()
        except ApiError as exc:
            status = exc.http_status
            raise ClientError.from_status(exc.status_json(), exc.status) from exc
        except Exception:
            status = 500
            raise
        finally:
            if permission and self.ctx.audit is not None:
                self.ctx.audit.record(principal=self.principal, permission=permission,
                                      resource=resource, method=method, status=status,
                                      now=self.ctx.now, reason=reason)

    def create_cluster(self, parent: Parent, cluster_id: str, body: Any) -> dict[str, Any]:
        return self._call(lambda: clusters.create(self.ctx, parent, body, cluster_id),
                          **_audit("modelDevelopmentClusters.create", parent, "POST"))

    def update_cluster(self, parent: Parent, cluster_id: str, body: Any) -> dict[str, Any]:
        return self._call(lambda: clusters.update(self.ctx, parent, cluster_id, body),
                          **_audit("modelDevelopmentClusters.update", parent, "PATCH",
                                   f"modelDevelopmentClusters/{cluster_id}"))

    def get_cluster(self, parent: Parent, cluster_id: str) -> dict[str, Any]:
        return self._call(lambda: clusters.get(self.ctx, parent, cluster_id))

    def list_clusters(self, parent: Parent, filter_text: str | None = None
                      ) -> list[dict[str, Any]]:
        return list(_pages(lambda token: self._call(lambda: clusters.list_clusters(
            self.ctx, parent, filter_text=filter_text, token=token)),
            "modelDevelopmentClusters"))

    def delete_cluster(self, parent: Parent, cluster_id: str) -> dict[str, Any]:
        return self._call(lambda: clusters.delete(self.ctx, parent, cluster_id),
                          **_audit("modelDevelopmentClusters.delete", parent, "DELETE",
                                   f"modelDevelopmentClusters/{cluster_id}"))

    def cluster_nodes(self, parent: Parent, cluster_id: str) -> list[dict[str, Any]]:
        return list(_pages(lambda token: self._call(lambda: clusters.nodes(
            self.ctx, parent, cluster_id, token=token)), "nodes"))

    def create_job(self, parent: Parent, body: Any, job_id: str | None) -> dict[str, Any]:
        return self._call(lambda: custom_jobs.create(self.ctx, parent, body, job_id),
                          **_audit("customJobs.create", parent, "POST"))

    def get_job(self, parent: Parent, job_id: str) -> dict[str, Any]:
        return self._call(lambda: custom_jobs.get(self.ctx, parent, job_id))

    def list_jobs(self, parent: Parent, filter_text: str | None = None
                  ) -> list[dict[str, Any]]:
        return list(_pages(lambda token: self._call(lambda: custom_jobs.list_jobs(
            self.ctx, parent, filter_text=filter_text, token=token)), "customJobs"))

    def cancel_job(self, parent: Parent, job_id: str) -> dict[str, Any]:
        return self._call(lambda: custom_jobs.cancel(self.ctx, parent, job_id),
                          **_audit("customJobs.cancel", parent, "POST",
                                   f"customJobs/{job_id}:cancel"))

    def delete_job(self, parent: Parent, job_id: str) -> dict[str, Any]:
        return self._call(lambda: custom_jobs.delete(self.ctx, parent, job_id),
                          **_audit("customJobs.delete", parent, "DELETE",
                                   f"customJobs/{job_id}"))

    def node_command(self, parent: Parent, cluster_id: str, node_id: str, verb: str,
                     reason: str) -> dict[str, Any]:
        return self._call(lambda: node_ops.act(self.ctx, parent, cluster_id, node_id, verb,
                                               {"reason": reason}, self.principal),
                          **_audit("modelDevelopmentClusters.update", parent, "POST",
                                   f"modelDevelopmentClusters/{cluster_id}/nodes/{node_id}:"
                                   f"{verb}"), reason=reason)

    def report_faulty_nodes(self, parent: Parent, cluster_id: str, body: Any
                            ) -> dict[str, Any]:
        return self._call(lambda: faulty_nodes.report(self.ctx, parent, cluster_id, body,
                                                      self.principal),
                          **_audit("modelDevelopmentClusters.reportFaultyNodes", parent, "POST",
                                   f"modelDevelopmentClusters/{cluster_id}:reportFaultyNodes"))

    def triage_policy(self, parent: Parent, cluster_id: str) -> dict[str, Any]:
        return self._call(lambda: triage_policy.get(self.ctx, parent, cluster_id))

    def triage_command(self, parent: Parent, cluster_id: str, verb: str, body: Any
                       ) -> dict[str, Any]:
        return self._call(lambda: triage_policy.act(self.ctx, parent, cluster_id, verb, body,
                                                    self.principal),
                          **_audit("modelDevelopmentClusters.update", parent, "POST",
                                   f"modelDevelopmentClusters/{cluster_id}/triagePolicy:"
                                   f"{verb}"), reason=str(body.get("reason", "")))

    def rollout_software(self, parent: Parent, cluster_id: str, body: Any) -> dict[str, Any]:
        return self._call(lambda: rollouts.start(self.ctx, parent, cluster_id, body,
                                                 self.principal),
                          **_audit("modelDevelopmentClusters.update", parent, "POST",
                                   f"modelDevelopmentClusters/{cluster_id}:rolloutSoftware"))

    def read_job_logs(self, parent: Parent, job_id: str, *, attempt: int | None = None,
                      rank: int | None = None, token: str | None = None) -> dict[str, Any]:
        return self._call(lambda: logs_api.read(self.ctx, parent, job_id, rank=_text(rank),
                                                attempt=_text(attempt), token=token))

    def wait_operation(self, name: str, timeout_s: float) -> dict[str, Any]:
        """Drive the control plane here (deliver, poll, tick) until the operation is done."""
        parent, op_id = operation_parent(name)
        current: dict[str, Any] = {}

        def done() -> bool:
            current.update(self._call(lambda: operations_api.get(self.ctx, parent, op_id)))
            return bool(current.get("done"))

        if not done():
            self.app.run(done, timeout_s=timeout_s)
        return current

    def wait_job(self, parent: Parent, job_id: str, timeout_s: float) -> dict[str, Any]:
        """Drive the control plane here until the job has ended (or the timeout)."""
        current: dict[str, Any] = {}

        def ended() -> bool:
            current.update(self.get_job(parent, job_id))
            return current.get("state") in JOB_ENDED

        if not ended():
            self.app.run(ended, timeout_s=timeout_s)
        return current

    def upload_model(self, parent: Parent, body: Any) -> dict[str, Any]:
        return self._call(lambda: models_api.upload(self.ctx, parent, body),
                          **_audit("models.upload", parent, "POST", "models:upload"))

    def endpoint_call(self, parent: Parent, method: str, tail: str, body: Any,
                      params: dict[str, str] | None) -> dict[str, Any]:
        rid, _, verb = tail.partition(":")
        ctx, chosen = self.ctx, (params or {}).get("endpointId")
        calls: dict[tuple[str, str], tuple[str, Callable[[], dict[str, Any]]]] = {
            ("POST", ""): ("create", lambda: endpoints.create(ctx, parent, body, chosen)),
            ("GET", ""): ("", lambda: endpoints.ENDPOINTS.list_page(ctx, parent)),
            ("GET", "get"): ("", lambda: endpoints.ENDPOINTS.get(ctx, parent, rid)),
            ("DELETE", "get"): ("delete", lambda: endpoints.delete(ctx, parent, rid)),
            ("POST", "deployModel"): ("deploy", lambda: endpoints.deploy_model(
                ctx, parent, rid, body)),
            ("POST", "undeployModel"): ("undeploy", lambda: endpoints.undeploy_model(
                ctx, parent, rid, body)),
            ("POST", "predict"): ("", lambda: serving_router.predict(ctx, parent, rid, body)),
        }
        key = (method, verb or ("get" if rid else ""))
        if key not in calls:
            raise ClientError("UNIMPLEMENTED", f"{method} endpoints/{tail}")
        permission, fn = calls[key]
        audit = _audit(f"endpoints.{permission}", parent, method,
                       f"endpoints/{tail}" if tail else "") if permission else {}
        return self._call(fn, **audit)

    def get_model(self, parent: Parent, model_id: str) -> dict[str, Any]:
        return self._call(lambda: models_api.get(self.ctx, parent, model_id))


def _audit(permission: str, parent: Parent, method: str, tail: str = "") -> dict[str, str]:
    collection = permission.split(".")[0]
    return {"permission": f"aiplatform.{permission}", "method": method,
            "resource": f"/{parent.name}/{tail or collection}"}


def _text(number: int | None) -> str | None:
    return None if number is None else str(number)


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


# ---------------------------------------------------------------- over HTTP


def checked_url(url: str) -> str:
    """``--api``'s URL, or a 400 that says how to write it (requests' InvalidSchema does not)."""
    scheme, _, rest = url.partition("://")
    if not rest or scheme not in ("http", "https"):
        raise ClientError("INVALID_ARGUMENT", f"--api: {url!r} is not an http(s) URL; write "
                          f"it as http://{rest or url} (MTC_API the same)")
    return url


class HttpClient:
    """The REST API of a running ``mtc serve`` (or any deployment of it), bearer token auth."""

    def __init__(self, url: str, token: str, *, timeout_s: float = 60.0,
                 session: requests.Session | None = None) -> None:
        self.url = checked_url(url).rstrip("/")
        self.timeout_s = timeout_s
        self.session = session or requests.Session()
        self.session.headers["Authorization"] = f"Bearer {token}"

    def _request(self, method: str, path: str, *, body: Any = None,
                 params: dict[str, str | None] | None = None,
                 timeout_s: float | None = None) -> dict[str, Any]:
        query = {k: v for k, v in (params or {}).items() if v is not None}
        try:
            response = self.session.request(method, f"{self.url}/{path}", json=body,
                                            params=query, timeout=timeout_s or self.timeout_s)
        except requests.RequestException as exc:
            raise ClientError("UNAVAILABLE", f"cannot reach {self.url}: "
                              f"{type(exc).__name__}: {exc}") from exc
        try:
            data = response.json() if response.content else {}
        except ValueError:
            data = None
        if response.ok and isinstance(data, dict):
            return data
        error = data.get("error") if isinstance(data, dict) else None
        if isinstance(error, dict):
            raise ClientError.from_status(error)
        raise ClientError(CODE_NAMES.get(_http_code(response.status_code), "UNKNOWN"),
                          f"HTTP {response.status_code} from {response.url}: "
                          f"{response.text[:200]}")

    def _list(self, path: str, key: str, filter_text: str | None) -> list[dict[str, Any]]:
        return list(_pages(lambda token: self._request(
            "GET", path, params={"filter": filter_text or None, "pageToken": token}), key))

    @staticmethod
    def _clusters(parent: Parent) -> str:
        return f"v1beta1/{parent.name}/modelDevelopmentClusters"

    @staticmethod
    def _jobs(parent: Parent) -> str:
        return f"v1/{parent.name}/customJobs"

    def create_cluster(self, parent: Parent, cluster_id: str, body: Any) -> dict[str, Any]:
        return self._request("POST", self._clusters(parent), body=body,
                             params={"modelDevelopmentClusterId": cluster_id})

    def update_cluster(self, parent: Parent, cluster_id: str, body: Any) -> dict[str, Any]:
        return self._request("PATCH", f"{self._clusters(parent)}/{cluster_id}", body=body)

    def get_cluster(self, parent: Parent, cluster_id: str) -> dict[str, Any]:
        return self._request("GET", f"{self._clusters(parent)}/{cluster_id}")

    def list_clusters(self, parent: Parent, filter_text: str | None = None
                      ) -> list[dict[str, Any]]:
        return self._list(self._clusters(parent), "modelDevelopmentClusters", filter_text)

    def delete_cluster(self, parent: Parent, cluster_id: str) -> dict[str, Any]:
        return self._request("DELETE", f"{self._clusters(parent)}/{cluster_id}")

    def cluster_nodes(self, parent: Parent, cluster_id: str) -> list[dict[str, Any]]:
        return self._list(f"{self._clusters(parent)}/{cluster_id}/nodes", "nodes", None)

    def create_job(self, parent: Parent, body: Any, job_id: str | None) -> dict[str, Any]:
        return self._request("POST", self._jobs(parent), body=body,
                             params={"customJobId": job_id})

    def get_job(self, parent: Parent, job_id: str) -> dict[str, Any]:
        return self._request("GET", f"{self._jobs(parent)}/{job_id}")

    def list_jobs(self, parent: Parent, filter_text: str | None = None
                  ) -> list[dict[str, Any]]:
        return self._list(self._jobs(parent), "customJobs", filter_text)

    def cancel_job(self, parent: Parent, job_id: str) -> dict[str, Any]:
        return self._request("POST", f"{self._jobs(parent)}/{job_id}:cancel", body={})

    def delete_job(self, parent: Parent, job_id: str) -> dict[str, Any]:
        return self._request("DELETE", f"{self._jobs(parent)}/{job_id}")

    def node_command(self, parent: Parent, cluster_id: str, node_id: str, verb: str,
                     reason: str) -> dict[str, Any]:
        return self._request("POST", f"{self._clusters(parent)}/{cluster_id}/nodes/"
                             f"{node_id}:{verb}", body={"reason": reason})

    def report_faulty_nodes(self, parent: Parent, cluster_id: str, body: Any
                            ) -> dict[str, Any]:
        return self._request("POST", f"{self._clusters(parent)}/{cluster_id}:reportFaultyNodes",
                             body=body)

    def triage_policy(self, parent: Parent, cluster_id: str) -> dict[str, Any]:
        return self._request("GET", f"{self._clusters(parent)}/{cluster_id}/triagePolicy")

    def triage_command(self, parent: Parent, cluster_id: str, verb: str, body: Any
                       ) -> dict[str, Any]:
        return self._request("POST", f"{self._clusters(parent)}/{cluster_id}/triagePolicy:"
                             f"{verb}", body=body)

    def rollout_software(self, parent: Parent, cluster_id: str, body: Any) -> dict[str, Any]:
        return self._request("POST", f"{self._clusters(parent)}/{cluster_id}:rolloutSoftware",
                             body=body)

    def read_job_logs(self, parent: Parent, job_id: str, *, attempt: int | None = None,
                      rank: int | None = None, token: str | None = None) -> dict[str, Any]:
        return self._request("GET", f"{self._jobs(parent)}/{job_id}/logs", params={
            "attempt": _text(attempt), "rank": _text(rank), "pageToken": token})

    def wait_operation(self, name: str, timeout_s: float) -> dict[str, Any]:
        """``:wait`` in slices (the server answers within a minute) until done or timeout."""
        operation_parent(name)
        deadline = time.monotonic() + timeout_s
        while True:
            left = max(0.0, deadline - time.monotonic())
            slice_s = min(left, WAIT_SLICE_S)
            op = self._request("POST", f"v1/{name}:wait", body={"timeout": f"{slice_s:.3f}s"},
                               timeout_s=slice_s + self.timeout_s)
            if op.get("done") or time.monotonic() >= deadline:
                return op

    def wait_job(self, parent: Parent, job_id: str, timeout_s: float) -> dict[str, Any]:
        """Poll the job (the server's own loop moves it) until it has ended or the timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            job = self.get_job(parent, job_id)
            if job.get("state") in JOB_ENDED or time.monotonic() >= deadline:
                return job
            time.sleep(JOB_POLL_S)

    def upload_model(self, parent: Parent, body: Any) -> dict[str, Any]:
        return self._request("POST", f"v1/{parent.name}/models:upload", body=body)

    def endpoint_call(self, parent: Parent, method: str, tail: str, body: Any,
                      params: dict[str, str] | None) -> dict[str, Any]:
        """``endpoints`` and ``endpoints/{tail}`` (an id, an id with its ``:verb``)."""
        path = f"v1/{parent.name}/endpoints" + (f"/{tail}" if tail else "")
        return self._request(method, path, body=body, params=dict(params or {}))

    def get_model(self, parent: Parent, model_id: str) -> dict[str, Any]:
        return self._request("GET", f"v1/{parent.name}/models/{model_id}")


def _http_code(http_status: int) -> int:
    for _name, (status, code) in CANONICAL.items():
        if status == http_status:
            return code
    return 2
