"""Cloud Storage's JSON API on the API's port (``services.api.storage``): buckets owned by a
project, objects as files of ``<output root>/gcs``, the three upload types, names that cannot
leave their bucket, every call authorized, errors in Google's shape naming the field."""

from __future__ import annotations

import base64
import errno
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest

from services.api.security import TOKENS_FILE
from services.api.storage_files import Tree
from services.api.tokens import LocalTokens
from tests.serving import PARENT
from tests.unit.api.conftest import AUTH, Api
from tests.unit.api.test_bucket_ownership import PACKAGE_IMAGE
from tests.unit.api.test_project_ids import _job

B = "/storage/v1/b"
UP = "/upload/storage/v1/b"


def make_bucket(api: Api, name: str = "bkt", project: str = "p", **kw: Any) -> Any:
    return api.call("POST", f"{B}?project={project}", {"name": name}, **kw)


def put(api: Api, name: str, data: bytes, bucket: str = "bkt", **kw: Any) -> Any:
    return api.client.post(f"{UP}/{bucket}/o", query_string={"uploadType": "media", "name": name},
                           data=data, headers=kw.pop("headers", None) or _auth(api), **kw)


def _auth(api: Api) -> dict[str, str]:
    return AUTH


def gcs(api: Api) -> Path:
    return api.app.deps.config.output_root / "gcs"


def field_of(resp: Any) -> str:
    return str(resp.json["error"]["details"][0]["fieldViolations"][0]["field"])


def token(api: Api, role: str, project: str) -> dict[str, str]:
    value = LocalTokens(api.app.state_dir / TOKENS_FILE).create(f"token:{role}-{project}", role,
                                                                project)
    return {"Authorization": f"Bearer {value}"}


def test_buckets_are_a_projects_directories(api: Api) -> None:
    made = make_bucket(api)
    assert made.status_code == 200, made.json
    assert made.json["name"] == "bkt" and made.json["kind"] == "storage#bucket"
    assert (gcs(api) / "bkt").is_dir()
    again = make_bucket(api, project="other")
    assert again.status_code == 409 and again.json["error"]["status"] == "ALREADY_EXISTS"
    assert api.call("GET", f"{B}/bkt").json["name"] == "bkt"
    assert [b["name"] for b in api.call("GET", f"{B}?project=p").json["items"]] == ["bkt"]
    assert api.call("GET", f"{B}?project=other").json["items"] == []
    assert api.call("GET", f"{B}/nope").status_code == 404
    bad = make_bucket(api, "Bad_Name!")
    assert bad.status_code == 400 and field_of(bad) == "name"
    assert field_of(api.call("GET", B)) == "project"


def test_objects_round_trip_with_googles_metadata(api: Api) -> None:
    make_bucket(api)
    data = b"hello, storage\n" * 100
    up = put(api, "dir/a.txt", data)
    assert up.status_code == 200, up.json
    meta = up.json
    assert meta["size"] == str(len(data)) and meta["bucket"] == "bkt"
    assert meta["md5Hash"] == base64.b64encode(hashlib.md5(data).digest()).decode()
    assert meta["crc32c"] and meta["generation"].isdigit() and meta["kind"] == "storage#object"
    assert (gcs(api) / "bkt" / "dir" / "a.txt").read_bytes() == data  # what a job sees at /gcs
    got = api.call("GET", f"{B}/bkt/o/dir%2Fa.txt")
    assert got.json["name"] == "dir/a.txt" and got.json["md5Hash"] == meta["md5Hash"]
    media = api.call("GET", f"{B}/bkt/o/dir%2Fa.txt?alt=media")
    assert media.data == data and f"md5={meta['md5Hash']}" in media.headers["X-Goog-Hash"]
    download = api.call("GET", "/download/storage/v1/b/bkt/o/dir%2Fa.txt?alt=media",
                        headers={**_auth(api), "Range": "bytes=5-9"})
    assert download.status_code == 206 and download.data == data[5:10]
    exists = api.client.post(f"{UP}/bkt/o", query_string={
        "uploadType": "media", "name": "dir/a.txt", "ifGenerationMatch": "0"},
        data=b"other", headers=_auth(api))
    assert exists.status_code == 412  # only if there is none: there is one
    assert (gcs(api) / "bkt" / "dir" / "a.txt").read_bytes() == data
    assert api.call("DELETE", f"{B}/bkt/o/dir%2Fa.txt").status_code == 204
    assert api.call("GET", f"{B}/bkt/o/dir%2Fa.txt").status_code == 404
    assert api.call("DELETE", f"{B}/bkt/o/dir%2Fa.txt").status_code == 404


def test_listing_by_prefix_delimiter_and_pages(api: Api) -> None:
    make_bucket(api)
    for name in ("a/1", "a/2", "a-b", "b/c/d", "top"):
        assert put(api, name, name.encode()).status_code == 200
    names = [o["name"] for o in api.call("GET", f"{B}/bkt/o").json["items"]]
    assert names == ["a-b", "a/1", "a/2", "b/c/d", "top"]  # name order, as Google's
    folders = api.call("GET", f"{B}/bkt/o?delimiter=/").json
    assert [o["name"] for o in folders["items"]] == ["a-b", "top"]
    assert folders["prefixes"] == ["a/", "b/"]
    under = api.call("GET", f"{B}/bkt/o?prefix=a/").json
    assert [o["name"] for o in under["items"]] == ["a/1", "a/2"]
    seen, page_token = [], ""
    while True:
        page = api.call("GET", f"{B}/bkt/o?maxResults=2&pageToken={page_token}").json
        seen += [o["name"] for o in page["items"]]
        page_token = page.get("nextPageToken", "")
        if not page_token:
            break
    assert seen == names
    assert field_of(api.call("GET", f"{B}/bkt/o?maxResults=x")) == "maxResults"


def test_multipart_upload_checks_the_clients_checksum(api: Api) -> None:
    make_bucket(api)

    def multipart(meta: dict[str, Any], data: bytes) -> Any:
        body = (b"--XX\r\ncontent-type: application/json; charset=UTF-8\r\n\r\n"
                + json.dumps(meta).encode() + b"\r\n--XX\r\ncontent-type: text/plain\r\n\r\n"
                + data + b"\r\n--XX--")
        return api.client.post(f"{UP}/bkt/o?uploadType=multipart", data=body, headers={
            **_auth(api), "Content-Type": 'multipart/related; boundary="XX"'})

    md5 = base64.b64encode(hashlib.md5(b"abc").digest()).decode()
    ok = multipart({"name": "m.txt", "md5Hash": md5}, b"abc")
    assert ok.status_code == 200, ok.json
    assert (gcs(api) / "bkt" / "m.txt").read_bytes() == b"abc"
    damaged = multipart({"name": "n.txt", "md5Hash": md5}, b"abd")
    assert damaged.status_code == 400 and field_of(damaged) == "md5Hash"
    assert not (gcs(api) / "bkt" / "n.txt").exists()
    assert list(Tree(api.app.deps.config.output_root).uploads.iterdir()) == []  # no temp left


def test_resumable_upload_in_chunks(api: Api) -> None:
    make_bucket(api)
    data = os.urandom(3000)
    start = api.call("POST", f"{UP}/bkt/o?uploadType=resumable", {"name": "big/blob.bin"})
    assert start.status_code == 200, start.json
    session = start.headers["Location"].split("://", 1)[1].split("/", 1)[1]

    def chunk(first: int, last: int, total: str) -> Any:
        return api.client.put(f"/{session}", data=data[first:last + 1], headers={
            **_auth(api), "Content-Range": f"bytes {first}-{last}/{total}"})

    first = chunk(0, 999, "*")
    assert first.status_code == 308 and first.headers["Range"] == "bytes=0-999"
    status = api.client.put(f"/{session}", headers={**_auth(api), "Content-Range": "bytes */*"})
    assert status.status_code == 308 and status.headers["Range"] == "bytes=0-999"
    again = chunk(500, 1999, "*")  # a resend overlapping what arrived: the rest is appended
    assert again.status_code == 308 and again.headers["Range"] == "bytes=0-1999"
    assert not (gcs(api) / "bkt" / "big").exists()  # nothing visible before the end
    done = chunk(2000, 2999, "3000")
    assert done.status_code == 200, done.json
    assert done.json["size"] == "3000"
    assert (gcs(api) / "bkt" / "big" / "blob.bin").read_bytes() == data
    gone = api.client.put(f"/{session}", headers={**_auth(api), "Content-Range": "bytes */3000"})
    assert gone.status_code == 404 and "upload session" in gone.json["error"]["message"]
    other = api.call("POST", f"{UP}/bkt/o?uploadType=resumable", {"name": "c"})
    bad = api.client.put(other.headers["Location"].split("://", 1)[1].split("/", 1)[1],
                         data=b"x", headers={**_auth(api), "Content-Range": "bytes 0-9/10"})
    assert bad.status_code == 400 and field_of(bad) == "Content-Range"  # 1 byte, not 10


@pytest.mark.parametrize("name", ["../outside", "a/../../outside", "/etc/passwd", "a\x00b",
                                  "a//b", "dir/", "./a", "a/.", "x" * 1025])
def test_names_never_leave_their_bucket(api: Api, name: str) -> None:
    make_bucket(api)
    resp = put(api, name, b"evil")
    assert resp.status_code == 400, resp.json
    assert field_of(resp) == "name"
    assert resp.json["error"]["errors"][0]["reason"] == "invalid"
    assert not (gcs(api).parent / "outside").exists()
    assert [p.name for p in (gcs(api) / "bkt").iterdir()] == []


def test_links_a_job_left_are_never_followed(api: Api, tmp_path: Path) -> None:
    make_bucket(api)
    secret = tmp_path / "secret"
    secret.write_text("the server's own file")
    (gcs(api) / "bkt" / "leak").symlink_to(secret)
    (gcs(api) / "bkt" / "dir").symlink_to(tmp_path, target_is_directory=True)
    assert api.call("GET", f"{B}/bkt/o/leak?alt=media").status_code == 404
    assert api.call("GET", f"{B}/bkt/o/dir%2Fsecret?alt=media").status_code == 404
    assert api.call("GET", f"{B}/bkt/o").json["items"] == []
    assert put(api, "dir/new", b"x").status_code == 409  # not written through the link
    assert not (tmp_path / "new").exists()
    assert api.call("DELETE", f"{B}/bkt/o/leak").status_code == 404
    assert secret.exists()


def test_every_call_is_authorized_against_the_buckets_project(api: Api) -> None:
    make_bucket(api, "mine", "p")
    put(api, "x", b"1", bucket="mine")
    anonymous = api.call("GET", f"{B}/mine/o", headers={})
    assert anonymous.status_code == 401
    assert "STORAGE_EMULATOR_HOST" in anonymous.json["error"]["message"]  # says what to do
    wrong = api.call("GET", f"{B}/mine/o", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and "STORAGE" not in wrong.json["error"]["message"]
    viewer = token(api, "viewer", "p")
    assert api.call("GET", f"{B}/mine/o/x?alt=media", headers=viewer).data == b"1"
    denied = put(api, "y", b"2", bucket="mine", headers=viewer)
    assert denied.status_code == 403 and "storage.objects.create" in denied.json["error"]["message"]
    other = token(api, "editor", "q")
    refused = api.call("GET", f"{B}/mine/o/x?alt=media", headers=other)
    assert refused.status_code == 403 and "projects/p" not in json.dumps(refused.json)
    assert make_bucket(api, "theirs", "p", headers=other).status_code == 403
    assert make_bucket(api, "theirs", "q", headers=other).status_code == 200
    assert api.call("GET", f"{B}?project=p", headers=other).status_code == 403
    assert api.call("PATCH", f"{B}/mine/o/x").status_code == 501


def test_a_full_disk_is_a_503_and_keeps_nothing(api: Api, monkeypatch: pytest.MonkeyPatch
                                                ) -> None:
    make_bucket(api)

    real = Tree.write_stream

    class Full:
        def write(self, data: bytes) -> int:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def flush(self) -> None:
            pass

    def full(self: Tree, out: Any, source: Any, limit: int | None = None) -> int:
        out.write(b"partial")
        return real(self, Full(), source, limit)  # type: ignore[arg-type]

    monkeypatch.setattr(Tree, "write_stream", full)
    resp = put(api, "a.bin", b"data")
    assert resp.status_code == 503 and resp.headers["Retry-After"] == "30"
    assert "no space left" in resp.json["error"]["message"]
    assert not (gcs(api) / "bkt" / "a.bin").exists()
    assert list(Tree(api.app.deps.config.output_root).uploads.iterdir()) == []


def _package_job(uri: str) -> dict[str, Any]:
    job = _job("c1")
    pool = job["jobSpec"]["workerPoolSpecs"][0]
    del pool["containerSpec"]
    pool["pythonPackageSpec"] = {"executorImageUri": PACKAGE_IMAGE, "pythonModule": "t.task",
                                 "packageUris": [uri]}
    return job


def test_package_uris_must_be_objects(api: Api) -> None:
    api.cluster(workers=1)
    field = "jobSpec.workerPoolSpecs[0].pythonPackageSpec.packageUris[0]"
    jobs = f"/v1/{PARENT}/customJobs"
    missing = api.call("POST", jobs, _package_job("gs://bkt/pkgs/t-0.1.tar.gz"))
    assert missing.status_code == 400 and field_of(missing) == field
    assert "does not exist" in missing.json["error"]["message"]
    host = api.call("POST", jobs, _package_job("/etc/passwd"))
    assert host.status_code == 400 and field_of(host) == field
    assert api.call("GET", jobs).json.get("customJobs", []) == []  # nothing was made
    make_bucket(api)
    assert put(api, "pkgs/t-0.1.tar.gz", b"not really a package").status_code == 200
    made = api.call("POST", jobs, _package_job("gs://bkt/pkgs/t-0.1.tar.gz"))
    assert made.status_code == 200, made.json
    api.call("POST", f"/v1/{made.json['name']}:cancel")


def test_a_bucket_a_job_names_is_its_projects_in_cloud_storage(api: Api) -> None:
    api.cluster(workers=1)
    job = _job("c1")
    job["jobSpec"]["baseOutputDirectory"] = {"outputUriPrefix": "gs://out-bkt/run"}
    made = api.call("POST", f"/v1/{PARENT}/customJobs", job)
    assert made.status_code == 200, made.json
    assert api.call("GET", f"{B}/out-bkt").status_code == 200
    assert [b["name"] for b in api.call("GET", f"{B}?project=p").json["items"]] == ["out-bkt"]
    assert make_bucket(api, "out-bkt", "q").status_code == 409  # taken, by the job's project
    other = token(api, "editor", "q")
    assert api.call("GET", f"{B}/out-bkt/o", headers=other).status_code == 403
    api.call("POST", f"/v1/{made.json['name']}:cancel")
