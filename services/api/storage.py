"""Cloud Storage's JSON API over the ``gcs/`` tree, on the API's own port.

The paths the Google client libraries use when ``STORAGE_EMULATOR_HOST`` names this server
(``google-cloud-storage``, and through it the Vertex AI SDK's staging): buckets (get, insert,
list), objects (get, ``alt=media``, list with ``prefix``/``delimiter``/``pageToken``,
delete), uploads (``uploadType=media``, ``multipart`` and ``resumable``) and
``/download/storage/v1/...``. Anything else under those prefixes is a 501 naming it. The
objects are files (``services.api.storage_files``); a bucket is a directory owned by one
project (``services.api.buckets``: the same owners the job, model and pipeline creates
claim): a bucket is made by ``POST /storage/v1/b?project=P`` or by a create in ``P`` that
names it, and every call on it is authorized against its owner's project with
Cloud Storage's permission names (``storage.objects.get``...: viewers read, editors write).

Every call needs a token, as every other route: the storage client sends the credentials it
is given (``storage.Client(credentials=...)``, or the SDK's ``credentials=``), and none
when it has none and ``STORAGE_EMULATOR_HOST`` is set; such a call is a 401 saying so.
Errors are Google's JSON error shape, naming the field.
"""

from __future__ import annotations

import base64
import logging
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import flask
from werkzeug.exceptions import RequestEntityTooLarge

from services.api import buckets, storage_uploads
from services.api.auth import Principal
from services.api.context import READING, ApiContext
from services.api.errors import ApiError, invalid
from services.api.names import parent
from services.api.storage_files import CHUNK, Tree, check_bucket, check_object
from shared.domain.errors import StorageFull, TransientError

log = logging.getLogger("mtc.api.storage")

PREFIXES = ("/storage/v1/", "/upload/storage/v1/", "/download/storage/v1/")
MAX_REQUEST_BYTES = 1 << 30  # one request's body (waitress's own limit too)
LIST_MAX = 1000
HASH_IN_LIST_MAX = 64 << 20  # a listing reads no larger object to give its hashes
NO_TOKEN_HINT = (" (google-cloud-storage sends no token when STORAGE_EMULATOR_HOST is set "
                 "and it was given no credentials: pass the same credentials as to "
                 "aiplatform.init, e.g. storage.Client(credentials=...) or "
                 "CustomJob.from_local_script(..., credentials=...))")


@dataclass(frozen=True)
class StorageRoute:
    method: str
    pattern: re.Pattern[str]
    permission: str
    handler: Callable[[StorageCall], flask.Response]
    reasoned: bool = False

    @property
    def mutates(self) -> bool:
        return self.method != "GET"


@dataclass(frozen=True)
class StorageCall:
    ctx: ApiContext
    request: flask.Request
    tree: Tree
    path: dict[str, str]
    principal: Principal
    permission: str

    @property
    def bucket(self) -> str:
        return check_bucket(self.path["bucket"])

    def render(self, bucket: str, name: str) -> flask.Response:
        """The object's resource, the answer to an upload."""
        return json_response(object_json(self, bucket, name))

    @property
    def base(self) -> str:
        return self.request.host_url.rstrip("/")

    def owned(self) -> str:
        """The bucket, once the caller may use it with this call's permission (its owner's
        project); a bucket no project owns is a 404."""
        bucket = self.bucket
        reading = READING.set(True)  # a read, whatever the call: no lock, no wait on the loop
        try:
            with self.ctx.unit() as uow:
                project = buckets.owner(uow, bucket)
        finally:
            READING.reset(reading)
        if project is None:
            raise ApiError("NOT_FOUND", f"bucket {bucket} not found: create it "
                           "(storage.Client(project=P).create_bucket, or POST /storage/v1/b"
                           "?project=P) or name it in a job of the project")
        try:
            self.ctx.guard.authorize(self.principal, self.permission, project, f"b/{bucket}")
        except ApiError:  # the owner's project is not named to a caller without access
            raise ApiError("PERMISSION_DENIED", f"Permission '{self.permission}' denied on "
                           f"bucket {bucket}", reason=self.permission) from None
        return bucket


def serves(path: str) -> bool:
    return path.startswith(PREFIXES)


_trees: dict[str, Tree] = {}


def tree_for(ctx: ApiContext) -> Tree | None:
    """The ``gcs/`` tree of the context's storage root (one per root: it keeps the checksums
    it has read); None: this deployment serves no Cloud Storage."""
    root = ctx.storage_root
    return None if root is None else _trees.setdefault(str(root), Tree(root))


Auditor = Callable[[ApiContext, Any, flask.Request, str, int, str], None]


def dispatch(request: flask.Request, ctx: ApiContext, audit: Auditor) -> flask.Response:
    """One Cloud Storage call: route, authenticate, authorize (in the handler, against the
    bucket's project), run, audit."""
    tree = tree_for(ctx)
    if tree is None:
        return _error(ApiError("NOT_FOUND", f"{request.path}: this deployment serves no "
                               "Cloud Storage: gs:// is Google's own"))
    request.max_content_length = MAX_REQUEST_BYTES
    route, groups = _route(request)
    if route is None:
        return _error(ApiError("UNIMPLEMENTED", f"{request.method} {request.path} is not "
                               "served by mtc's Cloud Storage (buckets get/insert/list, "
                               "objects get/list/delete/upload are)", http=501))
    who, status = "(unauthenticated)", 200
    try:
        header = request.headers.get("Authorization")
        try:
            principal = ctx.guard.identify(header)
        except ApiError as exc:
            if header:
                raise
            raise ApiError(exc.status, exc.message + NO_TOKEN_HINT) from None
        who = principal.name
        call = StorageCall(ctx, request, tree, groups, principal, route.permission)
        reading = READING.set(request.method == "GET")
        try:
            response = route.handler(call)
        finally:
            READING.reset(reading)
        status = response.status_code
    except ApiError as exc:
        status, response = exc.http_status, _error(exc)
    except RequestEntityTooLarge:
        status, response = 413, _error(ApiError(
            "RESOURCE_EXHAUSTED", f"a request's body is at most {MAX_REQUEST_BYTES} bytes: "
            "upload in resumable chunks", http=413))
    except StorageFull as exc:
        log.error("%s %s: %s", request.method, request.path, exc)
        status, response = 503, _error(ApiError("UNAVAILABLE", str(exc)))
        response.headers["Retry-After"] = "30"
    except TransientError as exc:
        log.warning("%s %s: %s", request.method, request.path, exc)
        status, response = 503, _error(ApiError("UNAVAILABLE", "the store is busy; retry"))
        response.headers["Retry-After"] = "1"
    except Exception:
        log.exception("%s %s failed", request.method, request.path)
        status, response = 500, _error(ApiError("INTERNAL", "internal error; the server "
                                                "log has the details"))
    if route.mutates and ctx.audit is not None:
        audit(ctx, route, request, who, status, request.path)
    return response


def _route(request: flask.Request) -> tuple[StorageRoute | None, dict[str, str]]:
    for route in ROUTES:
        match = route.pattern.fullmatch(request.path)
        if match is not None and route.method == request.method:
            return route, match.groupdict()
    return None, {}


def json_response(body: Any, status: int = 200) -> flask.Response:
    return flask.Response(flask.json.dumps(body), status=status, mimetype="application/json")


def _error(exc: ApiError) -> flask.Response:
    body = exc.body()
    # the JSON API's own shape besides google.rpc's: the client reads errors[0] as well
    body["error"]["errors"] = [{"message": exc.message, "domain": "global",
                                "reason": _REASONS.get(exc.http_status, "invalid")}]
    return json_response(body, exc.http_status)


_REASONS = {400: "invalid", 401: "required", 403: "forbidden", 404: "notFound",
            409: "conflict", 412: "conditionNotMet", 413: "uploadTooLarge",
            416: "requestedRangeNotSatisfiable", 501: "notImplemented", 503: "backendError"}


def rfc3339(seconds: float) -> str:
    whole = int(seconds)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)) + \
        f".{int((seconds - whole) * 1000):03d}Z"


def object_json(call: StorageCall, bucket: str, name: str, *, hashes: bool = True
                ) -> dict[str, Any]:
    """An object's resource, as ``objects.get`` gives it; FileNotFoundError: none."""
    if hashes:
        st, md5, crc = call.tree.sums(bucket, name)
    else:
        st, md5, crc = call.tree.stat(bucket, name), "", ""
    quoted = quote(name, safe="")
    when = rfc3339(st.mtime_ns / 1e9)
    out: dict[str, Any] = {
        "kind": "storage#object", "id": f"{bucket}/{name}/{st.mtime_ns}", "name": name,
        "bucket": bucket, "generation": str(st.mtime_ns), "metageneration": "1",
        "contentType": storage_uploads.content_type(name), "storageClass": "STANDARD",
        "size": str(st.size), "timeCreated": when, "updated": when,
        "etag": base64.b64encode(str(st.mtime_ns).encode()).decode(),
        "selfLink": f"{call.base}/storage/v1/b/{bucket}/o/{quoted}",
        "mediaLink": f"{call.base}/download/storage/v1/b/{bucket}/o/{quoted}"
                     f"?generation={st.mtime_ns}&alt=media"}
    if md5:
        out.update(md5Hash=md5, crc32c=crc)
    return out


def bucket_json(name: str, created: float) -> dict[str, Any]:
    when = rfc3339(created)
    return {"kind": "storage#bucket", "id": name, "name": name, "location": "US",
            "storageClass": "STANDARD", "metageneration": "1", "etag": "CAE=",
            "timeCreated": when, "updated": when}


# ---------------------------------------------------------------- buckets


def _project_arg(call: StorageCall) -> str:
    project = call.request.args.get("project", "")
    if not project:
        raise invalid("project", "is required: the project the buckets belong to")
    return parent(project, "global").project


def _list_buckets(call: StorageCall) -> flask.Response:
    project = _project_arg(call)
    call.ctx.guard.authorize(call.principal, call.permission, project, None)
    with call.ctx.unit() as uow:
        names = buckets.owned_by(uow, project)
        items = [bucket_json(b, float((uow.record(buckets.BUCKETS, b) or {}).get("time", 0)))
                 for b in names]
    return json_response({"kind": "storage#buckets", "items": items})


def _insert_bucket(call: StorageCall) -> flask.Response:
    project = _project_arg(call)
    call.ctx.guard.authorize(call.principal, call.permission, project, None)
    body = call.request.get_json(silent=True)
    if not isinstance(body, dict) or not isinstance(body.get("name"), str):
        raise invalid("name", "is required: the bucket's name")
    name = check_bucket(body["name"], "name")
    now = call.ctx.now
    with call.ctx.unit() as uow:
        made = buckets.create(uow, project, name, now)
    if not made:
        raise ApiError("ALREADY_EXISTS", f"name: bucket {name} already exists; bucket "
                       "names are shared by every project: choose another", http=409)
    call.tree.bucket_dir(name).mkdir(parents=True, exist_ok=True)
    return json_response(bucket_json(name, now))


def _get_bucket(call: StorageCall) -> flask.Response:
    bucket = call.owned()
    with call.ctx.unit() as uow:
        record = uow.record(buckets.BUCKETS, bucket) or {}
    return json_response(bucket_json(bucket, float(record.get("time", call.ctx.now))))


# ---------------------------------------------------------------- objects


def _object_name(call: StorageCall) -> str:
    name = call.path["object"]
    check_object(name, "object")
    return name


def _get_object(call: StorageCall) -> flask.Response:
    bucket, name = call.owned(), _object_name(call)
    if call.request.args.get("alt") == "media" or call.request.path.startswith("/download/"):
        return _media(call, bucket, name)
    try:
        return json_response(object_json(call, bucket, name))
    except FileNotFoundError:
        raise _no_object(bucket, name) from None


def _no_object(bucket: str, name: str) -> ApiError:
    return ApiError("NOT_FOUND", f"object gs://{bucket}/{name} not found")


def _media(call: StorageCall, bucket: str, name: str) -> flask.Response:
    try:
        st, md5, crc = call.tree.sums(bucket, name)
    except FileNotFoundError:
        raise _no_object(bucket, name) from None
    start, end = _range(call.request.headers.get("Range"), st.size)
    tree = call.tree

    def chunks() -> Iterator[bytes]:
        with tree.open(bucket, name) as (f, _):
            f.seek(start)
            left = end - start
            while left > 0 and (chunk := f.read(min(CHUNK, left))):
                left -= len(chunk)
                yield chunk

    partial = (start, end) != (0, st.size)
    response = flask.Response(chunks(), status=206 if partial else 200,
                              mimetype=storage_uploads.content_type(name))
    response.headers["Content-Length"] = str(end - start)
    response.headers["X-Goog-Hash"] = f"crc32c={crc},md5={md5}"
    response.headers["X-Goog-Generation"] = str(st.mtime_ns)
    response.headers["X-Goog-Stored-Content-Length"] = str(st.size)
    if partial:
        response.headers["Content-Range"] = f"bytes {start}-{end - 1}/{st.size}"
    return response


def _range(header: str | None, size: int) -> tuple[int, int]:
    """[start, end) of a ``Range: bytes=A-B`` / ``bytes=A-`` / ``bytes=-N`` header."""
    if not header:
        return 0, size
    match = re.fullmatch(r"\s*bytes=(\d*)-(\d*)\s*", header)
    if match is None or match.groups() == ("", ""):
        raise invalid("Range", f"{header!r} is not one byte range (bytes=A-B)")
    first, last = match.groups()
    if first == "":
        start, end = max(0, size - int(last)), size
    else:
        start, end = int(first), min(size, int(last) + 1) if last else size
    if (start >= size and size > 0) or start > end:
        raise ApiError("INVALID_ARGUMENT", f"Range: {header!r} is outside the object's "
                       f"{size} bytes", http=416)
    return start, end


def _list_objects(call: StorageCall) -> flask.Response:
    bucket = call.owned()
    args = call.request.args
    prefix, delimiter = args.get("prefix", ""), args.get("delimiter", "")
    for field in ("matchGlob", "startOffset", "endOffset"):
        if args.get(field):
            raise invalid(field, "is not supported by mtc's Cloud Storage")
    try:
        size = int(args.get("maxResults", LIST_MAX))
    except ValueError:
        raise invalid("maxResults", "must be a whole number") from None
    if not size >= 1:
        raise invalid("maxResults", "must be at least 1")
    size = min(size, LIST_MAX)
    after = _token(args.get("pageToken", ""))
    entries: list[tuple[str, bool]] = []  # (name or prefix, a prefix), in name order
    for name in sorted(call.tree.walk(bucket, prefix)):
        entry = name
        if delimiter and (cut := name.find(delimiter, len(prefix))) >= 0:
            entry = name[:cut + len(delimiter)]  # the names under it are next to it
        if entry > after and (not entries or entries[-1][0] != entry):
            entries.append((entry, entry != name))
    page = entries[:size]
    items = [e for e, folder in page if not folder]
    prefixes = [e for e, folder in page if folder]
    more = base64.urlsafe_b64encode(page[-1][0].encode()).decode() \
        if len(entries) > size else ""
    body: dict[str, Any] = {"kind": "storage#objects", "items": []}
    for name in items:
        try:
            st = call.tree.stat(bucket, name)
            body["items"].append(object_json(call, bucket, name,
                                             hashes=st.size <= HASH_IN_LIST_MAX))
        except FileNotFoundError:  # deleted since the walk
            continue
    if prefixes:
        body["prefixes"] = prefixes
    if more:
        body["nextPageToken"] = more
    return json_response(body)


def _token(token: str) -> str:
    if not token:
        return ""
    try:
        return base64.urlsafe_b64decode(token.encode()).decode()
    except (ValueError, UnicodeDecodeError):
        raise invalid("pageToken", "is not a token this server gave") from None


def _delete_object(call: StorageCall) -> flask.Response:
    bucket, name = call.owned(), _object_name(call)
    try:
        call.tree.delete(bucket, name)
    except FileNotFoundError:
        raise _no_object(bucket, name) from None
    return flask.Response(b"", status=204)


def _upload(call: StorageCall) -> flask.Response:
    bucket = call.owned()
    return storage_uploads.upload(call, bucket)


def _upload_chunk(call: StorageCall) -> flask.Response:
    bucket = call.owned()
    return storage_uploads.resume(call, bucket)


_B = r"/b/(?P<bucket>[^/]+)"
_O = r"/o/(?P<object>.+)"
OG, OL, OC, OD = ("storage.objects.get", "storage.objects.list", "storage.objects.create",
                  "storage.objects.delete")


def _r(method: str, path: str, permission: str,
       handler: Callable[[StorageCall], flask.Response]) -> StorageRoute:
    return StorageRoute(method, re.compile(path, re.DOTALL), permission, handler)


ROUTES: tuple[StorageRoute, ...] = (
    _r("GET", "/storage/v1/b", "storage.buckets.list", _list_buckets),
    _r("POST", "/storage/v1/b", "storage.buckets.create", _insert_bucket),
    _r("GET", f"/storage/v1{_B}", "storage.buckets.get", _get_bucket),
    _r("GET", f"/storage/v1{_B}/o", OL, _list_objects),
    _r("GET", f"/storage/v1{_B}{_O}", OG, _get_object),
    _r("DELETE", f"/storage/v1{_B}{_O}", OD, _delete_object),
    _r("GET", f"/download/storage/v1{_B}{_O}", OG, _get_object),
    _r("POST", f"/upload/storage/v1{_B}/o", OC, _upload),
    _r("PUT", f"/upload/storage/v1{_B}/o", OC, _upload_chunk),
)
