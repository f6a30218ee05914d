"""Checkpoints in three tiers, restored from the nearest complete one (numpy + stdlib only).

A program hands its state (named numpy arrays or bytes) and its step to a
``TieredCheckpointer``; the managed environment says where the tiers are
(``mtc_program.protocol``):

* tier 1, ``memory``: this rank's directory in its node's memory (``MTC_TIER1_DIR``, tmpfs),
  every ``MTC_TIER1_EVERY`` steps. The step blocks only for the snapshot (an in-memory copy
  of each array); a background thread encodes and writes it.
* tier 2, ``peer``: the same snapshot copied to this rank's buddy's node (``MTC_TIER2_DIR``),
  every ``MTC_TIER2_EVERY`` steps, by the same background thread. The buddy runs on another
  node, so one node's loss never takes both copies. With ``MTC_TIER2_URL`` the copy is sent
  over the network to the peer store service of the buddy's node (``mtc_program.peer_store``),
  which keeps it in that node's memory, and read back from ``MTC_TIER2_SOURCE_URL``.
* tier 3, ``durable``: ``AIP_CHECKPOINT_DIR`` in the worker protocol's ``ckpt-<step>.npz``
  format (the adapters' scan and older programs keep working), every ``MTC_TIER3_EVERY``
  steps and on SIGTERM; written before ``save`` returns.

Entries are atomic with a manifest written last (``entries``); a torn one is never used.
``restore`` finds the steps this rank can restore on every tier it reaches, agrees with the
other ranks on the newest step all of them can restore (``cut``) and loads it from the
nearest tier: memory, then the peer copy (``MTC_TIER2_SOURCE_DIR``), then durable. Every
entry is checked against its manifest (size, sha256) before use; one that fails, or whose
payload does not decode, gives way to the same step's entry on the next tier, and the
heartbeat's ``restore`` says which tier was used and which failed, and why. The tiers in
``MTC_RESTORE_SKIP`` are not read at all: the control plane names them when restarts that
restored from them made no progress (an entry can pass its checks and still be bad).
``replicated=True`` (data parallel: every rank holds the same state) lets a rank use any
rank's entry of that step; ``replicated=False`` (sharded) only its own. Retention keeps the
newest ``MTC_TIER_KEEP`` entries per tier (``MTC_TIER3_KEEP`` durable). A heartbeat
(``MTC_PROGRESS_FILE``) tells the control plane the step, the newest step per tier and the
last save's tier and blocking seconds, at most every ``progress_interval_s``.

Without ``MTC_TIER1_DIR`` the checkpointer is durable-only.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mtc_program import entries, peer_store
from mtc_program import protocol as n
from mtc_program.cut import agree
from mtc_program.entries import Entry, State
from mtc_program.tier_settings import TierSettings, skipped

TIER_ORDER = n.TIERS  # nearest first: restore prefers this order
__all__ = ["Restored", "SaveReport", "TierSettings", "TieredCheckpointer", "skipped"]


@dataclass(frozen=True)
class SaveReport:
    """One save as the program saw it: the tiers it went to and how long the step blocked."""

    step: int
    tiers: tuple[str, ...]
    blocking_s: float


@dataclass(frozen=True)
class Restored:
    step: int
    state: dict[str, np.ndarray | bytes]
    tier: str
    path: Path


@dataclass
class _Job:
    step: int
    snapshot: dict[str, np.ndarray | bytes]
    tiers: tuple[str, ...]


@dataclass
class WriteLog:
    """What the background thread wrote: (tier, step, thread name), and what failed."""

    writes: list[tuple[str, int, str]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def snapshot(state: State) -> dict[str, np.ndarray | bytes]:
    """The copy the step blocks for: every array copied (the program may change its own in
    place the moment ``save`` returns), bytes are immutable."""
    return {k: bytes(v) if isinstance(v, bytes | bytearray | memoryview) else np.array(v, copy=True)
            for k, v in state.items()}


class TieredCheckpointer:
    """Saves a rank's state to its tiers and restores the newest consistent step."""

    def __init__(self, settings: TierSettings, log: Callable[[str], None] = print) -> None:
        self.settings = settings
        self.log = log
        self.newest: dict[str, int | None] = dict.fromkeys(TIER_ORDER)
        # when this rank wrote each tier's newest entry, and when its first step since the
        # start or the restore ended (unix s): the control plane reads its files seconds
        # later, and times startup and saves by these, not by its reading
        self.newest_at: dict[str, float] = {}
        self.first_step_at: float | None = None
        self.last_save: SaveReport | None = None
        self.written = WriteLog()
        # the last restore: the step, the tier it came from, the entries that failed their
        # check (tier, step, why) and the tiers skipped; in the heartbeat as ``restore``
        self.restore_record: dict[str, object] | None = None
        self._failed: list[dict[str, object]] = []
        self._staged: Path | None = None  # the peer copies fetched for a restore, then dropped
        self._step = 0
        self._lock = threading.Lock()
        self._beat_at = -float("inf")
        # the first step after a start or a restore beats at once: it tells the control plane
        # the job trains again (fault to resumed), which the rate bound would delay
        self._first_step_pending = True
        self._queue: queue.Queue[_Job | None] = queue.Queue(maxsize=1)
        self._thread: threading.Thread | None = None
        # more heartbeat fields (``mtc_program.progress.RankProgress.link``: per-rank progress)
        self.extra: Callable[[], dict[str, object]] | None = None

    # ------------------------------------------------------------ saving

    def due(self, step: int) -> tuple[str, ...]:
        """The tiers whose interval ends at ``step``."""
        s = self.settings
        every = {n.MEMORY: s.tier1_every, n.PEER: s.tier2_every, n.DURABLE: s.tier3_every}
        return tuple(t for t in TIER_ORDER if every[t] and step % every[t] == 0)

    def maybe_save(self, step: int, state: State) -> SaveReport | None:
        """Save to the tiers due at ``step`` (none due: nothing, and a heartbeat if one is due)."""
        tiers = self.due(step)
        if not tiers:
            self.step_done(step)
            return None
        return self.save(step, state, tiers)

    def save(self, step: int, state: State, tiers: tuple[str, ...] | None = None) -> SaveReport:
        """Snapshot ``state`` and save it to ``tiers`` (default: every tier configured).
        Memory and peer are written by the background thread; durable before returning."""
        s = self.settings
        wanted = tiers if tiers is not None else TIER_ORDER
        background = tuple(t for t in wanted if (t == n.MEMORY and s.tier1_dir)
                           or (t == n.PEER and (s.tier2_dir or s.tier2_url)))
        began = time.perf_counter()
        copy = snapshot(state)
        if background:
            self._start()
            # one snapshot may wait while another is written; a third waits for the queue
            self._queue.put(_Job(step, copy, background))
        done = background
        if n.DURABLE in wanted and self._write_durable(step, copy, began):
            done = (*background, n.DURABLE)
        report = SaveReport(step, done, time.perf_counter() - began)
        with self._lock:
            self.last_save = report
            self._step = max(self._step, step)
            if n.DURABLE in done:
                self.newest_at[n.DURABLE] = time.time()
            first = self._stepped()
        self._heartbeat(force=first or n.DURABLE in done)
        return report

    def _write_durable(self, step: int, copy: dict[str, np.ndarray | bytes], began: float) -> bool:
        """Rank 0's copy of a replicated state, every rank's own of a sharded one."""
        s = self.settings
        if s.replicated and s.rank != 0:  # one copy of a replicated state is enough
            return False
        payload = entries.encode(copy)
        if s.replicated:
            entries.write_durable(s.durable_dir, step, s.rank, s.world_size, payload,
                                  save_s=time.perf_counter() - began)
            if s.durable_keep:
                entries.prune_durable(s.durable_dir, s.durable_keep)
        else:
            where = self._sharded_durable()
            entries.write_entry(where, step, s.rank, s.world_size, payload)
            if s.durable_keep:
                entries.prune(where, s.durable_keep)
        with self._lock:
            self.newest[n.DURABLE] = max(step, self.newest[n.DURABLE] or 0)
        return True

    def _sharded_durable(self) -> Path:
        return self.settings.durable_dir / "ranks" / n.rank_dir(self.settings.rank)

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="mtc-tier-writer", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        """The background writer: one job at a time, memory first, then the peer copy."""
        s = self.settings
        while (job := self._queue.get()) is not None:
            try:
                payload = entries.encode(job.snapshot)
                for tier in job.tiers:
                    where = s.tier1_dir if tier == n.MEMORY else s.tier2_dir
                    try:
                        if tier == n.PEER and s.tier2_url:  # to the buddy's memory, not a dir
                            peer_store.PeerClient(s.tier2_url, s.tier2_token).put(
                                s.rank, job.step, s.world_size, payload, s.keep)
                        else:
                            assert where is not None
                            entries.write_entry(where, job.step, s.rank, s.world_size, payload)
                            entries.prune(where, s.keep)
                    except OSError as exc:  # a peer unreachable must not stop training
                        self.written.errors.append(f"{tier} step {job.step}: {exc}")
                        self.log(f"tier {tier}: save of step {job.step} failed: {exc}")
                        continue
                    with self._lock:
                        self.newest[tier] = max(job.step, self.newest[tier] or 0)
                        self.newest_at[tier] = time.time()
                    self.written.writes.append((tier, job.step, threading.current_thread().name))
                self._heartbeat()
            except Exception as exc:  # a dead writer would hang the next save and the close
                self.written.errors.append(f"step {job.step}: {exc!r}")
                self.log(f"tiers: save of step {job.step} failed: {exc!r}")
            finally:
                self._queue.task_done()
        self._queue.task_done()

    def flush(self) -> None:
        """Wait until the background thread has written every snapshot handed to it."""
        if self._thread is not None:
            self._queue.join()

    def close(self) -> None:
        """Flush, stop the thread and write a last heartbeat (before the program exits)."""
        if self._thread is not None:
            self._queue.join()
            self._queue.put(None)
            self._thread.join()
            self._thread = None
        self._heartbeat(force=True)

    # ------------------------------------------------------------ heartbeat

    def step_done(self, step: int) -> None:
        """A step finished: a heartbeat if one is due (bounded rate), or if it is the first
        step since the program started or restored."""
        with self._lock:
            self._step = max(self._step, step)
            first = self._stepped()
        self._heartbeat(force=first)

    def _stepped(self) -> bool:
        """A step ended (the lock held): whether it is the first since the start or the
        restore, whose time is then kept."""
        first, self._first_step_pending = self._first_step_pending, False
        if first:
            self.first_step_at = time.time()
        return first

    def _heartbeat(self, force: bool = False) -> None:
        s = self.settings
        if s.progress_file is None:
            return
        with self._lock:
            now = time.monotonic()
            if not force and now - self._beat_at < s.progress_interval_s:
                return
            self._beat_at = now
            last = self.last_save
            body: dict[str, object] = {
                "rank": s.rank, "world_size": s.world_size, "attempt": s.attempt,
                "pid": os.getpid(), "step": self._step, "time": time.time(),
                "newest": dict(self.newest),
                "dirs": {n.MEMORY: str(s.tier1_dir or ""),
                         n.PEER: s.tier2_url or str(s.tier2_dir or ""),
                         n.DURABLE: str(s.durable_dir)},
                "last_save": None if last is None else {
                    "step": last.step, "tiers": list(last.tiers), "blocking_s": last.blocking_s},
            }
            if self.extra is not None:
                body.update(self.extra())
            # ours, after the linked fields: reset by a restore, which they know nothing of
            body.update(newest_at=dict(self.newest_at), first_step_at=self.first_step_at)
            if self.restore_record is not None:
                body["restore"] = self.restore_record
            with contextlib.suppress(OSError):  # a heartbeat is best effort
                s.progress_file.parent.mkdir(parents=True, exist_ok=True)
                entries.atomic_file(s.progress_file, json.dumps(body).encode())

    # ------------------------------------------------------------ restoring

    def candidates(self) -> list[Entry]:
        """Every entry this rank may restore from, nearest tier first (manifest read, payload
        not yet checked)."""
        s = self.settings
        seen: set[Path] = set()
        found: list[Entry] = []

        def add(directory: Path | None, tier: str) -> None:
            if directory is None:
                return
            key = directory.absolute()
            if key in seen:
                return
            seen.add(key)
            found.extend(entries.list_entries(directory, tier))

        memory = s.tier1_dir if n.MEMORY not in s.skip else None
        add(memory, n.MEMORY)
        if s.replicated and memory is not None:  # any copy on this node will do
            job_root = memory.parent
            for d in sorted(job_root.glob("rank-*")) + sorted(job_root.glob("peer/rank-*")):
                add(d, n.MEMORY)
        if n.PEER not in s.skip:
            add(self._fetch_peer(), n.PEER)
            add(s.tier2_source_dir, n.PEER)
            add(s.tier2_dir, n.PEER)
        if s.replicated:
            found.extend(entries.list_durable(s.durable_dir, s.rank, s.world_size))
        else:
            add(self._sharded_durable(), n.DURABLE)
        if not s.replicated:
            found = [e for e in found if e.rank == s.rank and e.world_size == s.world_size]
        order = {t: i for i, t in enumerate(TIER_ORDER)}
        return sorted(found, key=lambda e: (-e.step, order[e.tier]))

    def _fetch_peer(self) -> Path | None:
        """The copies the previous buddy's service holds for this rank, fetched into this
        node's memory (checked there like any entry); None: no service, or it failed."""
        s = self.settings
        if not s.tier2_source_url or s.tier1_dir is None:
            return None
        to = self._staged = s.tier1_dir.parent / ".peer-fetched" / n.rank_dir(s.rank)
        try:
            return peer_store.PeerClient(s.tier2_source_url, s.tier2_token).fetch_into(
                s.rank, to, wait_s=s.tier2_wait_s)
        except (OSError, ValueError) as exc:
            self.log(f"restore: the peer store {s.tier2_source_url} failed ({exc}); trying the next")
            return None

    def restorable(self, own_steps: Iterable[int] = ()) -> dict[int, list[Entry]]:
        """The steps with at least one whole entry, entries nearest first: the first whole
        entry of each step is checked here (payload read and hashed), the farther ones of
        that step only when it is loaded (``restore`` checks every entry it loads).
        ``own_steps``: steps whose state this process holds itself, restorable unread."""
        out: dict[int, list[Entry]] = {step: [] for step in own_steps}
        self._failed = []
        for e in self.candidates():
            if e.step in out:
                out[e.step].append(e)  # a fallback for that step, checked if it is needed
                continue
            payload, why = entries.check(e)
            if payload is not None:
                out[e.step] = [e]
            else:
                self._failure(e, why)
        return out

    def _failure(self, e: Entry, why: str) -> None:
        self._failed.append({"tier": e.tier, "step": e.step, "why": why})
        self.log(f"restore: the {e.tier} entry of step {e.step} failed its check ({why}): "
                 f"{e.path}; trying the next")

    def restore(self, own: Mapping[int, State] | None = None) -> Restored | None:
        """The state of the newest step every rank can restore, from the nearest tier that
        holds it whole; None: no such step (start from scratch). ``own``: the states this
        process kept of its last memory saves, by step (an in-process restart): used, not
        read back, when the ranks agree on one of those steps."""
        s = self.settings
        own = own or {}
        usable = self.restorable(own)
        step = agree(usable, s.rank, s.world_size, s.durable_dir, s.attempt,
                     s.restore_timeout_s, self.log)
        if step is None:
            self._restored(None, None)
            self._heartbeat(force=True)
            return None
        if step in own:
            where = usable[step][0].path if usable[step] else Path(f"/proc/{os.getpid()}")
            self._took(step, n.MEMORY, usable[step])
            return Restored(step, dict(own[step]), n.MEMORY, where)
        for e in usable[step]:
            payload, why = entries.check(e)
            state = None
            if payload is not None:
                try:
                    state = entries.decode(payload)
                except Exception as exc:  # whole by its hash, yet not ours to read: next tier
                    why = f"does not decode ({exc!r})"
            if state is None:
                self._failure(e, why)
                continue
            if self._failed:
                self.log(f"restore: step {step} from the {e.tier} tier after "
                         + "; ".join(f"{f['tier']} step {f['step']}: {f['why']}"
                                     for f in self._failed))
            self._took(step, e.tier, usable[step])
            return Restored(step, state, e.tier, e.path)
        self._restored(None, None)
        self._heartbeat(force=True)
        raise RuntimeError(f"restore: every entry of step {step} went bad while reading it")

    def _took(self, step: int, tier: str, found: list[Entry]) -> None:
        self._restored(step, tier)
        with self._lock:
            self._step = step
            self.newest = {t: (step if t == tier or any(x.tier == t for x in found) else None)
                           for t in TIER_ORDER}
            self.newest_at = {}  # written by an attempt before, whenever that was
            self._first_step_pending, self.first_step_at = True, None
        self._heartbeat(force=True)

    def _restored(self, step: int | None, tier: str | None) -> None:
        """What the control plane hears of this restore (the heartbeat's ``restore``)."""
        if self._staged is not None:  # read or not, the fetched copies would only take memory
            shutil.rmtree(self._staged, ignore_errors=True)
        with self._lock:
            self.restore_record = {"step": step, "tier": tier, "failed": list(self._failed),
                                   "skipped": list(self.settings.skip)}
