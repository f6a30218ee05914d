"""The peer tier over the network: a node's store of the peer copies its buddies send, and
the rank's client for it. Standard library only and importing nothing of mtc (the service
runs as ``python -I peer_store.py serve ...`` on a node, from this file's path).

**The service** owns one node's memory directory (``--root``, tmpfs: ``/dev/shm/...``) and a
byte budget for the peer copies it holds there. It speaks HTTP/1.1, every request carrying
``Authorization: Bearer <token>`` (the secret the launcher gave the ranks and the service;
never the control plane's):

* ``PUT /<job>/rank-<r>/<step>``: the body is the payload; ``X-Mtc-Sha256``,
  ``X-Mtc-World-Size`` and ``X-Mtc-Keep`` headers. A body whose sha256 is not the header's is
  refused (400), one larger than the budget too (413). It is stored as a tier entry (the
  layout of ``mtc_program.entries``: ``<root>/<job>/peer/rank-<r>/step-<step:010d>/`` with
  ``payload.npz`` and then ``manifest.json`` written under a temporary name, fsynced, and
  renamed into place), the rank's entries beyond ``keep`` are dropped, then the node's oldest
  peer entries (any job's) until the budget holds, never the one just written.
* ``GET /<job>/rank-<r>/``: the rank's manifests, newest step first (JSON).
* ``GET /<job>/rank-<r>/<step>``: the payload. The client checks it against the manifest
  (size, sha256), as every restore does.

A job is ``[A-Za-z0-9][A-Za-z0-9._-]*`` and the rest numbers: any other path (``..``,
escapes, more parts) is refused (400) before the file system is touched. The service exits
when ``--parent-pid`` does (the task that started it), so it never outlives its attempt.

**The client** (``PeerClient``) is what the tiered checkpointer uses when the environment
gives ``MTC_TIER2_URL`` (``http://<buddy's node>:<port>/<job>``): ``put`` sends a snapshot,
``fetch_into`` copies a rank's entries into a local directory in the entries' layout, where
the restore checks and reads them like any other tier's.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import hmac
import http.client
import json
import os
import re
import shutil
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Protocol

# the entries' layout (mtc_program.protocol, restated: this file imports nothing of mtc;
# a test checks that they agree)
ENTRY_RE = re.compile(r"^step-(\d{10})$")
PAYLOAD, MANIFEST = "payload.npz", "manifest.json"
FORMAT = 1
JOB_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
RANK_RE = re.compile(r"rank-(\d{1,9})")
STEP_RE = re.compile(r"\d{1,18}")
DEFAULT_BUDGET_BYTES = 4 << 30  # a node's memory for its buddies' copies, unless told
BIND_WAIT_S = 5.0  # a port still held by the previous attempt's service, leaving
CHUNK = 1 << 20
CONNECT_WAIT_S = 3.0  # a listing waits this long for a service still starting, by default


def entry_name(step: int) -> str:
    return f"step-{step:010d}"


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _write_file(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


class Readable(Protocol):
    def read(self, size: int, /) -> bytes: ...


class BadBody(ValueError):
    """A body that is not what its request said (short, or another hash)."""


def commit_entry(directory: Path, step: int, fill: Callable[[Path], None]) -> Path:
    """An entry whole or not at all: ``fill`` writes the payload, then the manifest, into a
    temporary directory, which is fsynced and renamed into place (any failure: nothing)."""
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / entry_name(step)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=directory))
    try:
        fill(tmp)
        _fsync_dir(tmp)
        if final.exists():  # the same step again: the old one leaves first
            old = directory / f".old-{final.name}-{os.getpid()}-{threading.get_ident()}"
            os.replace(final, old)
            shutil.rmtree(old, ignore_errors=True)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync_dir(directory)
    return final


def write_entry(directory: Path, manifest: dict[str, object], payload: bytes) -> Path:
    """An entry as received (a fetched copy: its manifest kept as the service gave it, so the
    restore checks the payload against it)."""
    def fill(tmp: Path) -> None:
        _write_file(tmp / PAYLOAD, payload)
        _write_file(tmp / MANIFEST, json.dumps(manifest).encode())

    return commit_entry(directory, int(str(manifest["step"])), fill)


def stream_entry(directory: Path, step: int, rank: int, world_size: int, body: Readable,
                 size: int, sha256: str) -> Path:
    """``size`` bytes of ``body`` stored as an entry, hashed as they are written (a copy never
    sits whole in the service's memory); short, or not ``sha256``: BadBody, nothing kept."""
    def fill(tmp: Path) -> None:
        digest, left = hashlib.sha256(), size
        with open(tmp / PAYLOAD, "wb") as f:
            while left:
                chunk = body.read(min(left, CHUNK))
                if not chunk:
                    raise BadBody(f"the body ended {left} bytes short")
                digest.update(chunk)
                f.write(chunk)
                left -= len(chunk)
            f.flush()
            os.fsync(f.fileno())
        if not hmac.compare_digest(digest.hexdigest(), sha256):
            raise BadBody("sha256 does not match")
        _write_file(tmp / MANIFEST, json.dumps({
            "format": FORMAT, "step": step, "rank": rank, "world_size": world_size,
            "size": size, "sha256": sha256}).encode())

    return commit_entry(directory, step, fill)


def read_manifest(entry: Path) -> dict[str, object] | None:
    try:
        data = json.loads((entry / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("format") == FORMAT else None


class PeerStore:
    """The node's peer copies under ``root`` (``<root>/<job>/peer/rank-<r>/step-*``) within
    ``budget_bytes``."""

    def __init__(self, root: Path, token: str, budget_bytes: int = DEFAULT_BUDGET_BYTES) -> None:
        if not token:
            raise ValueError("a peer store needs a token")
        self.root, self.token, self.budget = root, token, budget_bytes
        self._lock = threading.Lock()

    def rank_dir(self, job: str, rank: int) -> Path:
        return self.root / job / "peer" / f"rank-{rank}"

    def put(self, job: str, rank: int, step: int, world_size: int, body: Readable, size: int,
            sha256: str, keep: int) -> Path:
        """Store a copy (``stream_entry``), then keep the rank's newest ``keep`` and the
        node's budget. Only the bookkeeping is serialized, not the transfers."""
        directory = self.rank_dir(job, rank)
        final = stream_entry(directory, step, rank, world_size, body, size, sha256)
        with self._lock:
            self._prune(directory, keep)
            self._evict(keep_entry=final)
        return final

    def manifests(self, job: str, rank: int) -> list[dict[str, object]]:
        out = []
        with contextlib.suppress(OSError):
            for child in self.rank_dir(job, rank).iterdir():
                m = ENTRY_RE.match(child.name)
                data = read_manifest(child) if m else None
                if m and data is not None and data.get("step") == int(m.group(1)):
                    out.append(data)
        return sorted(out, key=lambda d: int(str(d["step"])), reverse=True)

    def payload(self, job: str, rank: int, step: int) -> bytes | None:
        try:
            return (self.rank_dir(job, rank) / entry_name(step) / PAYLOAD).read_bytes()
        except OSError:
            return None

    @staticmethod
    def _prune(directory: Path, keep: int) -> None:
        steps = sorted(c for c in directory.iterdir() if ENTRY_RE.match(c.name))
        for child in steps[:-keep] if keep > 0 else []:
            shutil.rmtree(child, ignore_errors=True)

    def _evict(self, keep_entry: Path) -> None:
        """The node's oldest peer entries (by when they were written) go until the budget
        holds; the entry just written stays whatever its size."""
        found = []
        for entry in self.root.glob("*/peer/rank-*/step-*"):
            with contextlib.suppress(OSError):
                size = sum(f.stat().st_size for f in entry.iterdir())
                found.append(((entry / MANIFEST).stat().st_mtime, size, entry))
        total = sum(size for _, size, _ in found)
        for _, size, entry in sorted(found):
            if total <= self.budget:
                break
            if entry != keep_entry:
                shutil.rmtree(entry, ignore_errors=True)
                total -= size


def parse_path(path: str) -> tuple[str, int, int | None] | None:
    """(job, rank, step or None for the listing) of a request path; None: refused."""
    parts = urllib.parse.urlsplit(path).path.split("/")
    if len(parts) != 4 or parts[0] != "":
        return None
    _, job, rank, step = parts
    m = RANK_RE.fullmatch(rank)
    if JOB_RE.fullmatch(job) is None or m is None:
        return None
    if step == "":
        return job, int(m.group(1)), None
    return (job, int(m.group(1)), int(step)) if STEP_RE.fullmatch(step) else None


class Handler(BaseHTTPRequestHandler):
    server: Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass  # one line per request would drown the node's log

    def _reply(self, code: int, body: bytes = b"", kind: str = "text/plain") -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _target(self) -> tuple[str, int, int | None] | None:
        given = self.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {self.server.store.token}".encode()):
            self._reply(401, b"bad token\n")
            return None
        target = parse_path(self.path)
        if target is None:
            self._reply(400, b"bad path\n")
        return target

    def do_GET(self) -> None:
        target = self._target()
        if target is None:
            return
        job, rank, step = target
        store = self.server.store
        if step is None:
            self._reply(200, json.dumps(store.manifests(job, rank)).encode(), "application/json")
            return
        payload = store.payload(job, rank, step)
        if payload is None:
            self._reply(404, b"no such entry\n")
        else:
            self._reply(200, payload, "application/octet-stream")

    def do_PUT(self) -> None:
        target = self._target()
        if target is None:
            return
        job, rank, step = target
        store = self.server.store
        try:
            size = int(self.headers.get("Content-Length", ""))
            world_size = int(self.headers.get("X-Mtc-World-Size", ""))
            keep = int(self.headers.get("X-Mtc-Keep", "3"))
        except ValueError:
            self._reply(400, b"bad headers\n")
            return
        if step is None or size < 0 or world_size < 1:
            self._reply(400, b"bad request\n")
            return
        if size > store.budget:
            self.close_connection = True  # the body is not read
            self._reply(413, b"larger than the node's budget\n")
            return
        try:
            store.put(job, rank, step, world_size, self.rfile, size,
                      self.headers.get("X-Mtc-Sha256", ""), keep)
        except BadBody as exc:
            self.close_connection = True  # what is left of the body is not read
            self._reply(400, f"{exc}\n".encode())
            return
        except OSError as exc:
            self._reply(507, f"cannot store: {exc.strerror or exc}\n".encode())
            return
        self._reply(201)


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], store: PeerStore) -> None:
        self.store = store
        super().__init__(address, Handler)


def serve_in_thread(store: PeerStore, host: str = "127.0.0.1", port: int = 0) -> Server:
    """A running service (tests, or a node agent that hosts it); ``shutdown()`` stops it."""
    server = Server((host, port), store)
    threading.Thread(target=server.serve_forever, name="mtc-peer-store", daemon=True).start()
    return server


# ---------------------------------------------------------------- the client


class PeerError(OSError):
    """The buddy's service refused or could not be reached."""


class PeerClient:
    """A rank's calls to one node's service at ``url`` (``http://host:port/<job>``)."""

    def __init__(self, url: str, token: str, timeout_s: float = 60.0) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme != "http" or not parts.hostname or parts.port is None:
            raise ValueError(f"a peer store URL is http://host:port/<job>, got {url!r}")
        self.host, self.port = parts.hostname, parts.port
        self.job = parts.path.strip("/")
        self.token, self.timeout_s = token, timeout_s

    def _call(self, method: str, path: str, body: bytes | None = None,
              headers: dict[str, str] | None = None, wait_s: float = 0.0,
              timeout_s: float | None = None) -> bytes:
        deadline = time.monotonic() + wait_s
        while True:
            conn = http.client.HTTPConnection(self.host, self.port,
                                              timeout=timeout_s or self.timeout_s)
            try:
                conn.request(method, f"/{self.job}/{path}", body=body, headers={
                    "Authorization": f"Bearer {self.token}", **(headers or {})})
                resp = conn.getresponse()
                data = resp.read()
            except (ConnectionRefusedError, ConnectionResetError):
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.2)  # the buddy's service is still starting (or the last one leaving)
                continue
            except (OSError, http.client.HTTPException) as exc:
                raise PeerError(f"peer store {self.host}:{self.port}: {exc}") from exc
            finally:
                conn.close()
            if resp.status == 401 and time.monotonic() < deadline:
                time.sleep(0.2)  # the previous attempt's service, with its token, still leaving
                continue
            if resp.status >= 300:
                raise PeerError(f"peer store {self.host}:{self.port}: {method} {path}: "
                                f"{resp.status} {data.decode(errors='replace').strip()}")
            return data

    def put(self, rank: int, step: int, world_size: int, payload: bytes, keep: int) -> None:
        self._call("PUT", f"rank-{rank}/{step}", payload, {
            "X-Mtc-Sha256": hashlib.sha256(payload).hexdigest(),
            "X-Mtc-World-Size": str(world_size), "X-Mtc-Keep": str(keep),
            "Content-Type": "application/octet-stream"})

    def manifests(self, rank: int, wait_s: float = 0.0) -> list[dict[str, object]]:
        # a dead node's address may not answer at all: the listing gives up soon
        data = json.loads(self._call("GET", f"rank-{rank}/", wait_s=wait_s, timeout_s=5.0))
        return [d for d in data if isinstance(d, dict)] if isinstance(data, list) else []

    def fetch(self, rank: int, step: int) -> bytes:
        return self._call("GET", f"rank-{rank}/{step}")

    def fetch_into(self, rank: int, directory: Path, wait_s: float = CONNECT_WAIT_S) -> Path:
        """The rank's entries held by the service, copied into ``directory`` (emptied first)
        as the service's manifests describe them: the restore checks each payload against its
        manifest before use. An entry that cannot be fetched is left out."""
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True, exist_ok=True)
        for manifest in self.manifests(rank, wait_s=wait_s):
            step = manifest.get("step")
            if not isinstance(step, int) or step < 0:
                continue
            try:
                payload = self.fetch(rank, step)
            except OSError:
                continue
            write_entry(directory, manifest, payload)
        return directory


# ---------------------------------------------------------------- the node's process


def _watch_parent(server: Server, parent: int) -> None:
    while True:
        time.sleep(1.0)
        try:
            os.kill(parent, 0)
        except ProcessLookupError:
            server.shutdown()
            return
        except PermissionError:
            pass  # alive, another user's


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="peer_store.py", description="a node's peer-copy store")
    ap.add_argument("command", choices=["serve"])
    ap.add_argument("--root", type=Path, required=True, help="the node's memory directory")
    ap.add_argument("--token-file", type=Path, required=True)
    ap.add_argument("--host", default="0.0.0.0")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--budget-bytes", type=int, default=DEFAULT_BUDGET_BYTES)
    ap.add_argument("--parent-pid", type=int, default=0, help="exit when this process does")
    args = ap.parse_args(argv)
    token = args.token_file.read_text().strip()
    args.root.mkdir(parents=True, exist_ok=True, mode=0o700)
    store = PeerStore(args.root, token, args.budget_bytes)
    deadline = time.monotonic() + BIND_WAIT_S
    while True:
        try:
            server = Server((args.host, args.port), store)
            break
        except OSError as exc:  # the previous attempt's service may still be leaving
            if time.monotonic() >= deadline:
                print(f"peer_store: cannot listen on {args.host}:{args.port}: {exc}",
                      file=sys.stderr)
                return 1
            time.sleep(0.2)
    if args.parent_pid:
        threading.Thread(target=_watch_parent, args=(server, args.parent_pid), daemon=True).start()
    print(f"peer_store: {args.root} on {args.host}:{args.port}", file=sys.stderr, flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
