"""Uploads, as the JSON API takes them: ``uploadType=media`` (the content, ``name`` in the
query), ``multipart`` (``multipart/related``: the object's JSON metadata, then its content;
what google-cloud-storage sends for files up to 8 MiB) and ``resumable`` (a session opened
with the metadata, then the content in ``PUT`` chunks with ``Content-Range``; larger files).

The content goes to a temporary file first; an ``md5Hash`` or ``crc32c`` the client sent is
checked against it (a 400 on a mismatch, nothing kept) and ``ifGenerationMatch`` is honoured
(``0``: only if there is no such object) before it is renamed into place. A resumable
session is ``<output root>/.gcs-uploads/<upload id>.json`` with its content so far beside it
(``.part``), so a session survives a restart of the server; a session left a week is removed.
"""

from __future__ import annotations

import json
import mimetypes
import re
import secrets
import threading
import time
from pathlib import Path
from typing import Any, Protocol

import flask

from services.api.auth import Principal
from services.api.errors import ApiError, invalid
from services.api.storage_files import Tree, check_object, file_sums

UPLOAD_ID = re.compile(r"[A-Za-z0-9_-]{16,64}")
SESSION_DAYS = 7
MULTIPART_MAX = 64 << 20  # a multipart body is read whole; the client's are 8 MiB at most
_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


class StorageCall(Protocol):
    """What an upload needs of its call (``services.api.storage.StorageCall``)."""

    @property
    def request(self) -> flask.Request: ...
    @property
    def tree(self) -> Tree: ...
    @property
    def principal(self) -> Principal: ...
    @property
    def base(self) -> str: ...

    def render(self, bucket: str, name: str) -> flask.Response: ...


def content_type(name: str) -> str:
    """The type an object is served with: by its name (the tree keeps no metadata)."""
    return mimetypes.guess_type(name)[0] or "application/octet-stream"


def upload(call: StorageCall, bucket: str) -> flask.Response:
    kind = call.request.args.get("uploadType", "")
    if kind == "media":
        name = call.request.args.get("name", "")
        check_object(name, "name")
        return _store(call, bucket, name, {}, lambda out: call.tree.write_stream(
            out, call.request.stream))
    if kind == "multipart":
        meta, content = _multipart(call.request)
        name = str(meta.get("name") or call.request.args.get("name") or "")
        check_object(name, "name")
        return _store(call, bucket, name, meta, lambda out: out.write(content))
    if kind == "resumable":
        return _open_session(call, bucket)
    raise invalid("uploadType", f"{kind!r} is not one of media, multipart, resumable")


def _store(call: StorageCall, bucket: str, name: str, meta: dict[str, Any], fill: Any
           ) -> flask.Response:
    temp, out = call.tree.temp()
    try:
        with out:
            fill(out)
        _finish(call, bucket, name, meta, temp)
    finally:
        temp.unlink(missing_ok=True)
    return call.render(bucket, name)


def _finish(call: StorageCall, bucket: str, name: str, meta: dict[str, Any], temp: Path
            ) -> None:
    """Check the content against what the client said, then rename it into place."""
    md5, crc = file_sums(temp)
    for field, got in (("md5Hash", md5), ("crc32c", crc)):
        said = meta.get(field)
        if said and said != got:
            raise invalid(field, f"the client's {said} is not the content's {got}: the "
                          "upload was damaged; nothing was kept")
    _precondition(call, bucket, name, meta.get("ifGenerationMatch")
                  or call.request.args.get("ifGenerationMatch"))
    call.tree.remember(bucket, name, call.tree.commit(temp, bucket, name), (md5, crc))


def _precondition(call: StorageCall, bucket: str, name: str, wanted: Any) -> None:
    if wanted is None or wanted == "":
        return
    try:
        generation = int(wanted)
    except (TypeError, ValueError):
        raise invalid("ifGenerationMatch", "must be a whole number") from None
    try:
        current = call.tree.stat(bucket, name).mtime_ns
    except FileNotFoundError:
        current = 0
    if current != generation:
        raise ApiError("FAILED_PRECONDITION", f"ifGenerationMatch: gs://{bucket}/{name} is at "
                       f"generation {current}, not {generation}", http=412)


def _multipart(request: flask.Request) -> tuple[dict[str, Any], bytes]:
    """(metadata, content) of a ``multipart/related`` body."""
    ctype = request.headers.get("Content-Type", "")
    match = re.search(r'boundary="?([^";]+)"?', ctype)
    if not ctype.startswith("multipart/related") or match is None:
        raise invalid("Content-Type", f"{ctype!r}: a multipart upload is multipart/related "
                      "with a boundary")
    if (request.content_length or 0) > MULTIPART_MAX:
        raise invalid("uploadType", f"a multipart body is at most {MULTIPART_MAX} bytes: "
                      "use a resumable upload")
    delimiter = b"--" + match.group(1).encode()
    body = request.get_data()
    parts = body.split(b"\r\n" + delimiter)
    if not parts[0].startswith(delimiter) or len(parts) < 3:
        raise invalid("(body)", "is not a multipart body of metadata and content")
    parts[0] = parts[0][len(delimiter):]
    found = []
    for part in parts[:2]:
        _, sep, content = part.removeprefix(b"\r\n").partition(b"\r\n\r\n")
        if not sep:
            raise invalid("(body)", "a multipart part has no blank line after its headers")
        found.append(content)
    try:
        meta = json.loads(found[0] or b"{}")
    except ValueError:
        raise invalid("(body)", "the multipart body's first part is not JSON metadata"
                      ) from None
    if not isinstance(meta, dict):
        raise invalid("(body)", "the multipart body's metadata must be a JSON object")
    return meta, found[1]


# ---------------------------------------------------------------- resumable sessions


def _session_paths(call: StorageCall, upload_id: str) -> tuple[Path, Path]:
    return (call.tree.uploads / f"{upload_id}.json", call.tree.uploads / f"{upload_id}.part")


def _open_session(call: StorageCall, bucket: str) -> flask.Response:
    body = call.request.get_data()
    try:
        meta = json.loads(body) if body.strip() else {}
    except ValueError:
        raise invalid("(body)", "a resumable upload starts with the object's JSON metadata"
                      ) from None
    if not isinstance(meta, dict):
        raise invalid("(body)", "the metadata must be a JSON object")
    name = str(meta.get("name") or call.request.args.get("name") or "")
    check_object(name, "name")
    _prune(call)
    upload_id = secrets.token_urlsafe(24)
    info, part = _session_paths(call, upload_id)
    call.tree.uploads.mkdir(parents=True, exist_ok=True)
    part.write_bytes(b"")
    info.write_text(json.dumps({
        "bucket": bucket, "name": name, "md5Hash": meta.get("md5Hash"),
        "crc32c": meta.get("crc32c"),
        "ifGenerationMatch": call.request.args.get("ifGenerationMatch"),
        "principal": call.principal.name, "time": time.time()}))
    response = flask.Response(b"", status=200)
    response.headers["Location"] = (f"{call.base}/upload/storage/v1/b/{bucket}/o"
                                    f"?uploadType=resumable&upload_id={upload_id}")
    return response


def _prune(call: StorageCall) -> None:
    old = time.time() - SESSION_DAYS * 86400
    for path in call.tree.uploads.glob("*") if call.tree.uploads.is_dir() else ():
        try:
            if path.stat().st_mtime < old:
                path.unlink()
        except OSError:
            continue


def _lock(upload_id: str) -> threading.Lock:
    with _locks_guard:
        if len(_locks) > 1024:
            _locks.clear()
        return _locks.setdefault(upload_id, threading.Lock())


def resume(call: StorageCall, bucket: str) -> flask.Response:
    """One ``PUT`` of a resumable session: content at an offset, or a status query."""
    upload_id = call.request.args.get("upload_id", "")
    if not UPLOAD_ID.fullmatch(upload_id):
        raise invalid("upload_id", "is not an upload id this server gave")
    info, part = _session_paths(call, upload_id)
    with _lock(upload_id):
        try:
            session = json.loads(info.read_text())
        except (OSError, ValueError):
            raise ApiError("NOT_FOUND", f"upload_id: no upload session {upload_id} (done, "
                           "cancelled or expired): start the upload again") from None
        if session.get("bucket") != bucket:
            raise invalid("upload_id", f"the session is for bucket {session.get('bucket')}")
        start, total = _content_range(call.request.headers.get("Content-Range"),
                                      call.request.content_length or 0)
        try:
            have = part.stat().st_size
        except FileNotFoundError:
            info.unlink(missing_ok=True)
            raise ApiError("NOT_FOUND", f"upload_id: session {upload_id} lost its content: "
                           "start the upload again") from None
        if start is not None and start <= have:
            with open(part, "r+b") as out:
                out.seek(have)
                _skip(call.request.stream, have - start)  # what it resent: already here
                call.tree.write_stream(out, call.request.stream)
            have = part.stat().st_size
        if total is not None and have >= total:
            if have > total:
                raise invalid("Content-Range", f"the content is {have} bytes, more than the "
                              f"{total} it said")
            return _complete(call, bucket, session, info, part)
        response = flask.Response(b"", status=308)
        if have:
            response.headers["Range"] = f"bytes=0-{have - 1}"
        return response


def _skip(stream: Any, count: int) -> None:
    while count > 0 and (chunk := stream.read(min(count, 1 << 20))):
        count -= len(chunk)


def _complete(call: StorageCall, bucket: str, session: dict[str, Any], info: Path, part: Path
              ) -> flask.Response:
    name = str(session["name"])
    try:
        _finish(call, bucket, name, session, part)
    finally:  # done, or it cannot succeed (its content was refused or is gone): it ends
        part.unlink(missing_ok=True)
        info.unlink(missing_ok=True)
    return call.render(bucket, name)


def _content_range(header: str | None, length: int) -> tuple[int | None, int | None]:
    """(first byte of this chunk, total size) of a ``Content-Range``: ``bytes A-B/T``,
    ``bytes A-B/*``, ``bytes */T`` (a status query) or none (the whole content)."""
    if header is None:
        return 0, length
    match = re.fullmatch(r"\s*bytes\s+(?:(\d+)-(\d+)|\*)/(\d+|\*)\s*", header)
    if match is None:
        raise invalid("Content-Range", f"{header!r} is not bytes A-B/TOTAL, bytes A-B/* or "
                      "bytes */TOTAL")
    first, last, total = match.groups()
    if first is not None and int(last) - int(first) + 1 != length:
        raise invalid("Content-Range", f"{header!r} does not match the {length} bytes sent")
    return (int(first) if first is not None else None,
            int(total) if total != "*" else None)
