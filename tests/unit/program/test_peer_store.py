"""The peer tier over the network: a node's peer store service (store, fetch, its budget, a
bad token or a path out of its directory refused, atomic entries), the SDK's client against
a real service on localhost, and a node whose memory is wiped restoring from the copy its
buddy's service holds in the buddy's own memory directory."""

from __future__ import annotations

import dataclasses
import hashlib
import http.client
import io
import json
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from mtc_program import entries, peer_store
from mtc_program import protocol as p
from mtc_program.peer_store import PeerClient, PeerError, PeerStore, Server, serve_in_thread
from mtc_program.tiers import TieredCheckpointer, TierSettings

TOKEN = "job-secret-1"


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Server]:
    server = serve_in_thread(PeerStore(tmp_path / "node-b" / "shm", TOKEN, budget_bytes=10_000))
    yield server
    server.shutdown()
    server.server_close()


def url(server: Server, job: str = "job1") -> str:
    return f"http://127.0.0.1:{server.server_address[1]}/{job}"


def raw(server: Server, method: str, path: str, token: str = TOKEN, body: bytes = b"",
        headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=10)
    try:
        conn.request(method, path, body=body or None,
                     headers={"Authorization": f"Bearer {token}", **(headers or {})})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def test_the_layout_restated_agrees_with_the_protocol() -> None:
    assert peer_store.ENTRY_RE.pattern == p.ENTRY_RE.pattern
    assert (peer_store.PAYLOAD, peer_store.MANIFEST) == (p.PAYLOAD, p.MANIFEST)
    assert peer_store.FORMAT == entries.FORMAT
    assert peer_store.entry_name(42) == p.entry_name(42)


def test_a_stored_copy_is_an_entry_in_the_tiers_format_and_comes_back(service: Server) -> None:
    client = PeerClient(url(service), TOKEN)
    payload = entries.encode({"w": np.arange(10.0)})
    client.put(3, 40, 4, payload, keep=3)
    directory = service.store.rank_dir("job1", 3)
    [entry] = entries.list_entries(directory, p.PEER)  # what a restore reads, checks and all
    assert (entry.step, entry.rank, entry.world_size) == (40, 3, 4)
    assert entries.check(entry) == (payload, "")
    assert client.fetch(3, 40) == payload
    assert [m["step"] for m in client.manifests(3)] == [40]
    assert client.manifests(2) == []


def test_keep_per_rank_and_the_budget_evicts_the_oldest(service: Server) -> None:
    client = PeerClient(url(service), TOKEN)
    for step in (1, 2, 3):  # keep 2 per rank
        client.put(0, step, 2, b"a" * 1000, keep=2)
    assert [m["step"] for m in client.manifests(0)] == [3, 2]
    for step in (1, 2, 3, 4):  # budget 10 000 bytes: rank 0's and rank 1's copies compete
        client.put(1, step, 2, b"b" * 3000, keep=5)
    left = {(0, m["step"]) for m in client.manifests(0)} | {(1, m["step"]) for m in client.manifests(1)}
    sizes = sum(f.stat().st_size for f in service.store.root.rglob("*") if f.is_file())
    assert sizes <= 10_000
    assert (1, 4) in left and (0, 2) not in left  # the newest stays, the oldest went first
    with pytest.raises(PeerError, match="413"):  # larger than the whole budget
        client.put(1, 9, 2, b"c" * 20_000, keep=5)


def test_a_bad_token_is_refused_and_nothing_is_stored(service: Server) -> None:
    with pytest.raises(PeerError, match="401"):
        PeerClient(url(service), "not-the-secret").put(0, 1, 1, b"x", keep=3)
    assert raw(service, "GET", "/job1/rank-0/", token="wrong")[0] == 401
    assert not service.store.root.exists() or not any(service.store.root.rglob("step-*"))


@pytest.mark.parametrize("path", ["/../rank-0/1", "/job1/rank-0/../../x", "/%2e%2e/rank-0/1",
                                  "/job1/../rank-0/1", "/.hidden/rank-0/1", "/job1/0/1",
                                  "/job1/rank-0/1/extra", "/job1/rank-0/-1", "/job1/rank-x/1"])
def test_a_path_out_of_the_store_is_refused(service: Server, path: str) -> None:
    body = b"payload"
    status, _ = raw(service, "PUT", path, body=body, headers={
        "X-Mtc-Sha256": hashlib.sha256(body).hexdigest(), "X-Mtc-World-Size": "1"})
    assert status == 400
    assert raw(service, "GET", path)[0] == 400
    assert not any(service.store.root.parent.parent.rglob("payload.npz"))


def test_a_body_that_is_not_what_its_hash_says_is_refused(service: Server) -> None:
    status, _ = raw(service, "PUT", "/job1/rank-0/5", body=b"torn", headers={
        "X-Mtc-Sha256": hashlib.sha256(b"whole").hexdigest(), "X-Mtc-World-Size": "1"})
    assert status == 400
    assert PeerClient(url(service), TOKEN).manifests(0) == []


def test_a_write_that_fails_midway_leaves_the_previous_entry_whole(
        service: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    client = PeerClient(url(service), TOKEN)
    client.put(0, 7, 1, b"first", keep=3)
    real = peer_store._write_file

    def torn(path: Path, data: bytes) -> None:
        if path.name == peer_store.MANIFEST:
            raise OSError(28, "No space left on device")
        real(path, data)

    monkeypatch.setattr(peer_store, "_write_file", torn)
    with pytest.raises(PeerError, match="507"):
        client.put(0, 7, 1, b"second", keep=3)
    directory = service.store.rank_dir("job1", 0)
    assert [c.name for c in directory.iterdir()] == [p.entry_name(7)]  # no temp left behind
    assert client.fetch(0, 7) == b"first"


def test_an_unreachable_store_is_an_oserror(tmp_path: Path) -> None:
    server = serve_in_thread(PeerStore(tmp_path, TOKEN))
    port = server.server_address[1]
    server.shutdown()
    server.server_close()
    with pytest.raises(OSError):
        PeerClient(f"http://127.0.0.1:{port}/job1", TOKEN).fetch_into(0, tmp_path / "x", wait_s=0.3)


def test_a_listing_waits_out_the_previous_attempts_service_on_the_port(tmp_path: Path) -> None:
    """The port is the job's across attempts: the last attempt's service (its own token) may
    answer for a moment before it leaves and this attempt's starts; a 401 then is waited out."""
    old = serve_in_thread(PeerStore(tmp_path / "old", "attempt-1-secret"))
    port = old.server_address[1]
    new = PeerStore(tmp_path / "new", TOKEN)
    new.put("job1", 0, 5, 1, io.BytesIO(b"five"), 4, hashlib.sha256(b"five").hexdigest(), keep=2)
    started: list[Server] = []

    def hand_over() -> None:
        time.sleep(0.5)
        old.shutdown()
        old.server_close()
        started.append(serve_in_thread(new, port=port))

    threading.Thread(target=hand_over).start()
    try:
        got = PeerClient(f"http://127.0.0.1:{port}/job1", TOKEN).fetch_into(
            0, tmp_path / "x", wait_s=10.0)
        assert [e.name for e in got.iterdir()] == [p.entry_name(5)]
        with pytest.raises(PeerError, match="401"):  # past the wait, a wrong token is refused
            PeerClient(f"http://127.0.0.1:{port}/job1", "wrong").manifests(0, wait_s=0.0)
    finally:
        for server in started:
            server.shutdown()
            server.server_close()


def state(step: int) -> dict[str, np.ndarray | bytes]:
    return {"w": np.full(8, float(step)), "rng": f"rng-{step}".encode()}


def test_a_wiped_node_restores_from_the_copy_in_its_buddys_memory(tmp_path: Path) -> None:
    """Rank 0 runs on node A, its buddy's node is B: each node's memory directory is its own
    and B's service keeps the peer copy. A loses its memory (a reboot, a replacement): the
    next attempt's rank 0 gets the step back from B's memory, not from durable storage, and
    nothing of it ever was in A's directory or in a directory named for B on A's side."""
    mem_a, mem_b = tmp_path / "a" / "shm", tmp_path / "b" / "shm"
    node_b = serve_in_thread(PeerStore(mem_b, TOKEN))
    try:
        env = {p.TIER1_DIR: str(mem_a / "job1" / "rank-0"), p.TIER2_URL: url(node_b),
               p.TIER2_TOKEN: TOKEN, p.TIER1_EVERY: "5", p.TIER2_EVERY: "5"}
        first = TierSettings.from_env(env, durable_dir=tmp_path / "durable", rank=0,
                                      world_size=1, tier3_every=100, replicated=False)
        assert first.tier2_dir is None and first.tier2_every == 5
        cp = TieredCheckpointer(first, log=lambda _: None)
        for step in range(1, 11):
            cp.maybe_save(step, state(step))
        cp.close()
        assert cp.written.errors == []
        held = mem_b / "job1" / "peer" / "rank-0"
        assert [e.step for e in entries.list_entries(held, p.PEER)] == [10, 5]
        assert not list(mem_a.rglob("peer"))  # the copy went over the network only

        shutil.rmtree(mem_a)  # node A's memory is gone; durable holds nothing yet
        logs: list[str] = []
        again = TieredCheckpointer(TierSettings.from_env(
            env, durable_dir=tmp_path / "durable", rank=0, world_size=1, replicated=False),
            log=logs.append)
        restored = again.restore()
        assert restored is not None, logs
        assert (restored.step, restored.tier) == (10, p.PEER)
        assert restored.state["rng"] == b"rng-10"
        assert not list(mem_a.rglob("step-*"))  # the fetched copies left A's memory once read
        assert json.loads((held / p.entry_name(10) / p.MANIFEST).read_text())["rank"] == 0
    finally:
        node_b.shutdown()
        node_b.server_close()


def test_a_peer_store_down_falls_back_to_durable(tmp_path: Path) -> None:
    node_b = serve_in_thread(PeerStore(tmp_path / "b", TOKEN))
    env = {p.TIER1_DIR: str(tmp_path / "a" / "job1" / "rank-0"), p.TIER2_URL: url(node_b),
           p.TIER2_TOKEN: TOKEN, p.TIER1_EVERY: "5", p.TIER2_EVERY: "5", p.TIER3_EVERY: "10"}
    s = dataclasses.replace(TierSettings.from_env(
        env, durable_dir=tmp_path / "durable", rank=0, world_size=1, replicated=False),
        tier2_wait_s=0.5)  # the wait for a buddy's service still starting, ended sooner
    cp = TieredCheckpointer(s, log=lambda _: None)
    for step in range(1, 11):
        cp.maybe_save(step, state(step))
    cp.close()
    node_b.shutdown()
    node_b.server_close()
    shutil.rmtree(tmp_path / "a")
    logs: list[str] = []
    restored = TieredCheckpointer(s, log=logs.append).restore()
    assert restored is not None and (restored.step, restored.tier) == (10, p.DURABLE)
    assert any("peer store" in line for line in logs)


def test_the_node_process_serves_its_memory_and_ends_with_its_task(tmp_path: Path) -> None:
    """As task.sh starts it: ``python -I peer_store.py serve`` (nothing of mtc on its path),
    watching the task's pid; it exits once that task is gone."""
    import socket
    import subprocess
    import sys


    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (tmp_path / "token").write_text(TOKEN + "\n")
    task = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    service = subprocess.Popen(
        [sys.executable, "-I", peer_store.__file__, "serve", "--root", str(tmp_path / "shm"),
         "--token-file", str(tmp_path / "token"), "--host", "127.0.0.1", "--port", str(port),
         "--budget-bytes", "100000", "--parent-pid", str(task.pid)],
        stderr=subprocess.PIPE, text=True)
    try:
        client = PeerClient(f"http://127.0.0.1:{port}/job1", TOKEN)
        assert client.manifests(0, wait_s=10.0) == []
        client.put(0, 3, 1, b"copy", keep=3)
        assert client.fetch(0, 3) == b"copy"
        assert (tmp_path / "shm" / "job1" / "peer" / "rank-0" / p.entry_name(3)).is_dir()
        task.kill()
        task.wait()
        assert service.wait(timeout=10) == 0
    finally:
        for proc in (task, service):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if service.stderr is not None:
            service.stderr.close()
