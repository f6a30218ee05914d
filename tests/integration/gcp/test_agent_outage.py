"""The node agent across a Pub/Sub outage: nothing lost, each report once, original times.

The real agent (``python -m services.node_agent``, a subprocess) publishes to the official
Pub/Sub emulator through a TCP gate this test opens and closes: while the gate is closed the
bus is unreachable (connections refused, as for a network partition), the agent spools. The
agent is SIGKILLed mid-outage and a new one starts on the same spool. Once the gate opens,
every report both agents observed arrives once, with its own event id and its observation
time as the CloudEvent ``time``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gcp_support import PROJECT, ROOT, wait_for

pytestmark = [pytest.mark.integration]

XID_LINE = "Dec  1 10:00:00 n kernel: NVRM: Xid (PCI:0000:3b:00): {code}, pid=1, name=t, x\n"


class Gate:
    """A TCP forwarder on a fixed loopback port that can be shut (refusing) and reopened."""

    def __init__(self, upstream: str) -> None:
        host, port = upstream.rsplit(":", 1)
        self.upstream = (host, int(port))
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()
        self._listener: socket.socket | None = None
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def open(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(16)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def shut(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        with self._lock:
            for conn in self._conns:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
                conn.close()
            self._conns.clear()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while chunk := src.recv(65536):
                dst.sendall(chunk)
        except OSError:
            pass
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


class Agent:
    """``mtc-agent --interval`` as a subprocess; its stdout (one report a line) collected."""

    def __init__(self, config: Path, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "services.node_agent", "--interval", "0.2", "--config",
             str(config)], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True)
        self.reports: list[dict[str, Any]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.reports.append(json.loads(line))

    def observed(self, code: int) -> dict[str, Any] | None:
        return next((r for r in self.reports if code in r["conditions"][0]["details"]["xids"]),
                    None)

    def wait_acknowledged(self, code: int) -> None:
        """Until the report with ``code`` and one more were printed: the first is spooled and
        its XID cursor committed (collect, print, spool, acknowledge, then the next run)."""
        first = wait_for(lambda: self.observed(code), 20, what=f"the agent sees XID {code}")
        wait_for(lambda: len(self.reports) > self.reports.index(first) + 1, 20,
                 what="the next report")

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


@pytest.fixture
def bus(emulators: dict[str, str]) -> Iterator[tuple[Any, str, str, Gate]]:
    from google.cloud import pubsub_v1

    publisher = pubsub_v1.PublisherClient()
    subscriber = pubsub_v1.SubscriberClient()
    suffix = str(time.monotonic_ns())
    topic = publisher.topic_path(PROJECT, f"mtc-node-agent-{suffix}")
    sub = subscriber.subscription_path(PROJECT, f"agent-outage-{suffix}")
    publisher.create_topic(name=topic)
    subscriber.create_subscription(name=sub, topic=topic)
    gate = Gate(emulators["PUBSUB_EMULATOR_HOST"])
    gate.open()
    yield subscriber, sub, topic.rsplit("/", 1)[1], gate
    gate.shut()
    subscriber.delete_subscription(subscription=sub)
    publisher.delete_topic(topic=topic)


def pull_all(subscriber: Any, sub: str, want: int) -> list[Any]:
    got: list[Any] = []
    deadline = time.monotonic() + 30
    quiet_until = None
    while time.monotonic() < deadline:
        resp = subscriber.pull(subscription=sub, max_messages=100, timeout=5)
        if resp.received_messages:
            got += [m.message for m in resp.received_messages]
            subscriber.acknowledge(subscription=sub,
                                   ack_ids=[m.ack_id for m in resp.received_messages])
            quiet_until = None
        elif len(got) >= want:
            quiet_until = quiet_until or time.monotonic() + 2  # no late duplicates either
            if time.monotonic() > quiet_until:
                break
        time.sleep(0.1)
    return got


def queued(spool: Path) -> int:
    con = sqlite3.connect(spool)
    try:
        return int(con.execute("SELECT COUNT(*) FROM reports").fetchone()[0])
    finally:
        con.close()


def test_no_report_is_lost_across_a_bus_outage_and_a_killed_agent(
    tmp_path: Path, bus: tuple[Any, str, str, Gate]
) -> None:
    subscriber, sub, topic, gate = bus
    kern = tmp_path / "kern.log"
    kern.write_text("")
    spool = tmp_path / "spool.sqlite3"
    config = tmp_path / "agent.json"
    config.write_text(json.dumps({
        "node_id": "n-outage", "probes": ["xid"], "xid_source": str(kern),
        "xid_cursor_path": str(tmp_path / "xid.cursor"),
        "delivery": {"transport": "pubsub", "project": PROJECT, "topic": topic,
                     "spool_path": str(spool), "timeout_s": 2.0},
    }))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GOOGLE_CLOUD_PROJECT": PROJECT,
           "PUBSUB_EMULATOR_HOST": gate.address}

    agent = Agent(config, env)
    try:
        with kern.open("a") as log:
            log.write(XID_LINE.format(code=13))
        agent.wait_acknowledged(13)
        wait_for(lambda: queued(spool) == 0, 20, what="delivery while the bus is up")

        gate.shut()  # the outage
        codes_during = (31, 43, 45, 48)
        for code in codes_during[:2]:
            with kern.open("a") as log:
                log.write(XID_LINE.format(code=code))
            agent.wait_acknowledged(code)
        agent.kill()  # mid-outage, with reports spooled
        assert queued(spool) >= 2
        first_life = list(agent.reports)

        agent = Agent(config, env)  # a new agent on the same spool (systemd Restart=always)
        for code in codes_during[2:]:
            with kern.open("a") as log:
                log.write(XID_LINE.format(code=code))
            agent.wait_acknowledged(code)
        assert queued(spool) >= 4
        outage_over_at = time.time()
        gate.open()  # the bus is back
        wait_for(lambda: queued(spool) == 0, 30, what="the spool drains")
    finally:
        agent.stop()

    observed = {code: r for code in (13, *codes_during)
                for r in (*first_life, *agent.reports)
                if code in r["conditions"][0]["details"]["xids"]}
    messages = pull_all(subscriber, sub, want=5)
    ids = [m.attributes["ce-id"] for m in messages]
    assert len(ids) == len(set(ids)), "a report was delivered twice"
    by_code: dict[int, list[Any]] = {}
    for m in messages:
        data = json.loads(m.data)
        for code in data["conditions"][0]["details"]["xids"]:
            by_code.setdefault(code, []).append((m, data))
    assert sorted(by_code) == [13, *codes_during], "a fault report was lost"
    for code, delivered in by_code.items():
        [(message, data)] = delivered  # once
        assert data["observed_at"] == observed[code]["observed_at"]
        assert message.attributes["ce-type"] == "mtc.node.health_reported.v1"
        assert message.attributes["ce-source"] == "//mtc/node-agent/n-outage"
        sent_time = dt.datetime.fromisoformat(message.attributes["ce-time"])
        assert sent_time.timestamp() == pytest.approx(data["observed_at"], abs=1e-3)
        if code in codes_during:
            assert data["observed_at"] < outage_over_at  # observed then, delivered later
