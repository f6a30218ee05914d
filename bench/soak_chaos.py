"""The soak's storage and client chaos: a full disk, a damaged state file, stalled
clients and a store another process holds locked, each with what must hold besides the soak's
standing invariants (nothing lost, nothing stuck, no job on a faulty node, ...).

All real: the state directory is a real tmpfs (mounted when root; not root, ``disk_full`` is
skipped and reported "unknown", never "ok"), the damage is done to the real ``mtc.db`` and
undone by the real ``mtc state restore``, the clients are raw sockets against the soak's real
``mtc serve`` (``bench/soak_controller.py --port``), and the lock is sqlite's own
``BEGIN EXCLUSIVE`` from another connection.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

from shared.adapters import state_files
from shared.domain.model import NodeState

if TYPE_CHECKING:
    from bench.soak import Soak

TEETH_WEIGHTS: dict[str, float] = {  # relative odds, beside soak_settings.CHAOS_WEIGHTS
    "disk_full": 0.3, "damaged_state": 0.15, "stalled_client": 0.3, "slow_store": 0.3,
}
TEETH_MUST_HAPPEN = ("stalled_client", "slow_store", "disk_full", "damaged_state")  # longest last
DISK_SIZE = "256m"  # the state's tmpfs: the databases, the logs and every job's checkpoints
FILL_S = (1.0, 3.0)  # the disk stays full this long
LOCK_S = (1.0, 3.0)  # another process holds mtc.db's write lock this long
STALL_S = 4.0  # stalled clients hold their sockets this long while a fault is injected
STALLED_SOCKETS = 24  # idle connections (each holds one of waitress's channels)
SLOWLORIS_SOCKETS = 8  # connections that send a header byte every half second
API_ANSWER_S = 10.0  # another client's call must be answered within this, stalls or not
DRAIN_BOUND_S = 15.0  # a fault that takes a node out: out of service within this, stalls or not
REFUSE_WITHIN_S = 45.0  # a controller over a damaged state exits (refusing) within this
RESTART_S = 5.0  # a restarted server's start (imports, the integrity check), part of an outage
OFF_DISK = ("jobs", "compute/run", "compute/logs")  # off the small disk unless asked
DAMAGE_KINDS = ("empty", "truncated", "header")
TOKEN = "soak-admin-token-0123456789abcdef"  # the server's admin token (MTC_API_TOKEN)
IN_SERVICE = (NodeState.IDLE, NodeState.ALLOCATED)
JOBS_PATH = "/v1beta1/projects/soak/locations/local/customJobs?pageSize=5"


def _q(xs: list[float], q: float) -> float | None:
    return round(xs[min(len(xs) - 1, int(q * len(xs)))], 3) if xs else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Teeth:
    """The four kinds, each a ``chaos_<kind>`` returning whether it happened; what must hold
    is checked in place (``soak.violate``) and each kind's verdict kept for the report."""

    def __init__(self, soak: Soak, *, jobs_on_small_disk: bool = True) -> None:
        self.s = soak
        self.jobs_on_small_disk = jobs_on_small_disk
        self.off_disk = soak.state_dir.parent / f"{soak.state_dir.name}-off-disk"
        self.port = free_port()
        self.mounted = False
        self.mount_note = ""
        self.backups = soak.state_dir.parent / f"{soak.state_dir.name}-backups"
        self.violated: set[str] = set()
        self.answers: Counter[str] = Counter()  # "<kind> <status>" of the other clients' calls
        self.api_s: list[float] = []
        self.fault_to_drain_s: list[float] = []
        self.refusals = 0
        self.outage_s: list[float] = []  # controller down for a damaged_state, each

    # ------------------------------------------------------------------ set-up

    def mount(self) -> None:
        """The state directory on a small tmpfs, when root (unmounted by ``unmount``)."""
        if os.geteuid() != 0:
            self.mount_note = "not root: no tmpfs, disk_full not run"
            return
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_SIZE},mode=0700",
                               "tmpfs", str(self.s.state_dir)],
                              capture_output=True, text=True, check=False)
        self.mounted = done.returncode == 0
        self.mount_note = "" if self.mounted else f"mount failed: {done.stderr.strip()}"
        if self.mounted and not self.jobs_on_small_disk:
            # the jobs' side (checkpoints, worker logs, exit files) lives elsewhere: a program
            # failing for want of space is still judged by its exit (docs/reliability.md)
            shutil.rmtree(self.off_disk, ignore_errors=True)
            for sub in OFF_DISK:
                (self.off_disk / sub).mkdir(parents=True)
                (self.s.state_dir / sub).parent.mkdir(parents=True, exist_ok=True)
                (self.s.state_dir / sub).symlink_to(self.off_disk / sub)

    def unmount(self) -> None:
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.s.state_dir)], check=False)
            self.mounted = False
        shutil.rmtree(self.backups, ignore_errors=True)
        shutil.rmtree(self.off_disk, ignore_errors=True)

    def kinds(self) -> list[str]:
        return [k for k in TEETH_WEIGHTS if k != "disk_full" or self.mounted]

    def status(self) -> dict[str, str]:
        """Per kind: ok (happened, nothing violated), violated, not run, or unknown."""
        out = {}
        for kind in TEETH_WEIGHTS:
            if kind == "disk_full" and not self.mounted and self.mount_note:
                out[kind] = f"unknown ({self.mount_note})"
            elif kind in self.violated:
                out[kind] = "violated"
            else:
                out[kind] = "ok" if self.s.fig.chaos[kind] else "not run"
        return out

    def figures(self) -> dict[str, Any]:
        api = sorted(self.api_s)
        drain = sorted(self.fault_to_drain_s)
        return {
            "storage_and_client_chaos": self.status(),
            "api_answers_under_chaos": dict(sorted(self.answers.items())),
            "api_call_s": {"n": len(api), "p50": _q(api, 0.5), "max": _q(api, 1.0)},
            "stalled_fault_to_drain_s": {"n": len(drain), "p50": _q(drain, 0.5),
                                         "max": _q(drain, 1.0)},
            "damaged_state_refusals": self.refusals,
            "damaged_state_outage_s": [round(x, 1) for x in self.outage_s],
        }

    def fail(self, kind: str, key: tuple[Any, ...], invariant: str, detail: str) -> None:
        self.violated.add(kind)
        self.s.violate(key, invariant, detail)

    # ------------------------------------------------------------------ the API as a client

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> int:
        """One call by a well-behaved client; its status (0: no answer in API_ANSWER_S)."""
        start = time.monotonic()
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=API_ANSWER_S)
        try:
            conn.request(method, path, body=json.dumps(body) if body is not None else None,
                         headers={"Authorization": f"Bearer {TOKEN}",
                                  "Content-Type": "application/json"})
            status = conn.getresponse().status
        except OSError:
            status = 0
        finally:
            conn.close()
        self.api_s.append(time.monotonic() - start)
        return status

    def answered(self, kind: str, status: int, allowed: tuple[int, ...]) -> None:
        self.answers[f"{kind} {status}"] += 1
        if status not in allowed:
            self.fail(kind, ("api", kind, status, self.s.fig.chaos[kind]), "the API answers",
                      f"during {kind}: a call got {status or 'no answer'} "
                      f"(want one of {allowed}) from the soak's mtc serve")

    def server_up(self) -> bool:
        """The soak's server runs and answers /healthz now (a restarted one may still be
        starting: then this chaos waits for a later draw rather than block the soak)."""
        if not self.s.controller.running():
            return False
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2.0)
        try:
            conn.request("GET", "/healthz")
            return conn.getresponse().status == 200
        except OSError:
            return False
        finally:
            conn.close()

    # ------------------------------------------------------------------ the kinds

    def chaos_disk_full(self) -> bool:
        """Fill the tmpfs to its last block, hold it, free it: the controller keeps running
        (``ControllerChild.keep`` counts an exit as a violation), reads answer, the databases pass
        their integrity check after, and no job fails of it (check_final)."""
        if not self.mounted or not self.server_up():
            return False
        filler = self.s.state_dir / "soak-filler"
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            for chunk in (1 << 20, 1 << 12, 1):
                with contextlib.suppress(OSError):
                    while True:
                        os.write(fd, b"\0" * chunk)
        finally:
            os.close(fd)
        try:
            hold = self.s.rng.uniform(*FILL_S)
            self.s.say(f"disk full for {hold:.1f} s")
            time.sleep(hold / 2)
            self.answered("disk_full", self.call("GET", JOBS_PATH), (200,))
            time.sleep(hold / 2)
        finally:
            filler.unlink()
        found = state_files.check(self.s.state_dir)  # nothing half-written: sqlite's own check
        if found:
            self.fail("disk_full", ("half-written", self.s.fig.chaos["disk_full"]),
                      "nothing half-written", "after the disk was full: "
                      + "; ".join(map(str, found)))
        return True

    def chaos_slow_store(self) -> bool:
        """Another process holds mtc.db's write lock: a read and a write sent meanwhile are
        answered (200, or 503 busy; never a 500 or silence) once it lets go, the controller
        waits or retries, nothing lost. (The server has one connection and one lock per
        process, so a read queues behind a pass waiting for the lock: the figures show it.)"""
        if not self.server_up():
            return False
        hold = self.s.rng.uniform(*LOCK_S)
        calls: dict[str, tuple[str, str, dict[str, Any] | None]] = {"read": ("GET", JOBS_PATH, None),
                 # a cancel of no job: a 404, and its audit record a write that needs the lock
                 "write": ("POST", "/v1beta1/projects/soak/locations/local/customJobs/"
                           "soak-none:cancel", {})}
        results: dict[str, int] = {}
        threads = [threading.Thread(target=lambda k=k, c=c: results.__setitem__(
            k, self.call(*c)), daemon=True) for k, c in calls.items()]
        db = sqlite3.connect(self.s.state_dir / state_files.STATE_DB, timeout=30.0,
                             isolation_level=None)
        try:
            db.execute("BEGIN EXCLUSIVE")
            self.s.say(f"mtc.db write-locked by another process for {hold:.1f} s")
            for t in threads:
                t.start()
            time.sleep(hold)
        finally:
            with contextlib.suppress(sqlite3.Error):
                db.execute("ROLLBACK")
            db.close()
        for t in threads:
            t.join(API_ANSWER_S)
        self.answered("slow_store", results.get("read", 0), (200, 503))
        self.answered("slow_store", results.get("write", 0), (404, 503))
        return True

    def chaos_stalled_client(self) -> bool:
        """Idle sockets and a slowloris against the server while a node faults: another
        client is answered and the faulty node is taken out within DRAIN_BOUND_S."""
        if not self.server_up():
            return False
        stop = threading.Event()
        socks: list[socket.socket] = []
        for i in range(STALLED_SOCKETS + SLOWLORIS_SOCKETS):
            with contextlib.suppress(OSError):
                s = socket.create_connection(("127.0.0.1", self.port), timeout=2.0)
                if i >= STALLED_SOCKETS:
                    s.sendall(b"GET /v1beta1/projects/soak/locations/local/customJobs HTTP/1.1\r\n")
                socks.append(s)
        slow = socks[STALLED_SOCKETS:]

        def drip() -> None:
            while not stop.wait(0.5):
                for s in slow:
                    with contextlib.suppress(OSError):
                        s.sendall(b"X-a: b\r\n")

        dripper = threading.Thread(target=drip, daemon=True)
        dripper.start()
        try:
            self.s.say(f"{len(socks)} stalled client sockets, then a fault")
            faulted_at = self.s.now()
            node = self.fault_that_takes_out()
            self.answered("stalled_client", self.call("GET", JOBS_PATH), (200,))
            self.answered("stalled_client", self.call("GET", "/readyz"), (200, 503))
            if node is not None:
                self.await_drain(node, faulted_at)
            time.sleep(max(0.0, STALL_S - 1.0))
        finally:
            stop.set()
            dripper.join(2.0)
            for s in socks:
                s.close()
        return True

    def fault_that_takes_out(self) -> str | None:
        """An XID 79 (reboot) on a live in-service node: it is taken out, or held SUSPECT
        when the blast-radius guard has no room; either way the state changes."""
        nodes = [n for n in self.s.fleet_chaos.live_workers() if n.state in IN_SERVICE]
        if not nodes:
            return None
        node = self.s.rng.choice(nodes)
        if not self.s.fleet_chaos.inject(node):
            return None
        return node.node_id

    def await_drain(self, node_id: str, start: float) -> None:
        while self.s.now() - start < DRAIN_BOUND_S:
            nodes, _ = self.s.read_state()
            n = next((m for ms in nodes.values() for m in ms if m.node_id == node_id), None)
            if n is None or n.state not in IN_SERVICE:
                self.fault_to_drain_s.append(self.s.now() - start)
                return
            time.sleep(0.1)
        self.fail("stalled_client", ("stall-drain", node_id, start), "healing goes on",
                  f"{node_id} faulted (XID 79) with {STALLED_SOCKETS + SLOWLORIS_SOCKETS} "
                  f"stalled clients open: still in service after {DRAIN_BOUND_S:.0f} s")

    def chaos_damaged_state(self) -> bool:
        """Stop the controller, back up online, damage mtc.db: a controller started over it
        must refuse, naming the file; `mtc state restore` puts the backup back, and the
        controller starts again (the standing invariants then say nothing was lost)."""
        s = self.s
        if not self.server_up():
            return False
        s.outages.append((s.now(), None))  # planned: the bounds pause (soak.elapsed)
        s.controller.stop()
        n = s.fig.chaos["damaged_state"] + 1
        backup = self.backups / f"b{n}"
        self.backups.mkdir(parents=True, exist_ok=True)
        state_files.backup(s.state_dir, backup)
        s.a.close()  # the soak's own handle: the last connection checkpoints the WAL
        s.app = None
        db = s.state_dir / state_files.STATE_DB
        kind = s.rng.choice(DAMAGE_KINDS)
        size = db.stat().st_size
        with open(db, "r+b") as f:
            if kind == "empty":
                f.truncate(0)
            elif kind == "truncated":
                f.truncate(size // 2)
            else:
                f.write(os.urandom(100))  # the header: no longer a database
        s.say(f"mtc.db damaged ({kind}, was {size} bytes); starting a controller over it")
        try:
            done = subprocess.run(s.controller.argv(), cwd=s.root, capture_output=True,
                                  text=True, timeout=REFUSE_WITHIN_S, check=False,
                                  env={**os.environ, "MTC_API_TOKEN": TOKEN})
            code, said = done.returncode, done.stdout + done.stderr
        except subprocess.TimeoutExpired as exc:  # it served over the damage (now killed)
            code, said = None, str(exc.stdout or "") + str(exc.stderr or "")
        if code != 2 or str(db) not in said:
            self.fail("damaged_state", ("damaged", n), "a damaged state is refused, named",
                      f"controller over mtc.db damaged ({kind}) "
                      + (f"exited {code}" if code is not None else
                         f"still ran after {REFUSE_WITHIN_S:.0f} s")
                      + f", want exit 2 naming {db}: {said.strip()[-300:]!r}")
        else:
            self.refusals += 1
        restored = subprocess.run(
            [sys.executable, "-m", "services.cli.main", "--state-dir", str(s.state_dir),
             "state", "restore", str(backup)],
            cwd=s.root, capture_output=True, text=True, timeout=60, check=False)
        if restored.returncode != 0:
            self.fail("damaged_state", ("restore", n), "a backup restores",
                      f"mtc state restore exited {restored.returncode}: "
                      f"{(restored.stdout + restored.stderr).strip()[-300:]!r}")
        for left in s.state_dir.rglob("*.damaged"):  # the tmpfs is small
            left.unlink()
        shutil.rmtree(backup, ignore_errors=True)
        s.reopen()
        s.controller.down_until = s.now()  # started again at once
        s.controller.keep()
        self.outage_s.append(s.now() - s.outages[-1][0])
        s.outages[-1] = (s.outages[-1][0], s.now() + RESTART_S)  # + the server's start
        return True
