"""NVIDIA XID errors from the kernel log, each reported exactly once.

The driver logs ``NVRM: Xid (PCI:0000:3b:00): 79, pid=..., name=..., <text>``. Some codes use
other tails: XID 154 says ``GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset
Required)``, and that named action is what triage needs, so it is kept in
``details["recovery_action"]``. A cursor (file offset, or dmesg timestamp plus boot id)
makes each XID reported once even though the log is re-read on every collection.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from shared.domain.health import Condition, ConditionType
from shared.probes.commands import ProbeError, Runner
from shared.probes.conditions import healthy, problem

_PCI = r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-9A-Fa-f])?"
_XID_RE = re.compile(rf"NVRM: Xid \((?:PCI:)?(?P<pci>{_PCI})\):\s*(?P<code>\d+)\s*(?:,\s*(?P<rest>.*))?$")
_PID_RE = re.compile(r"^pid=(?P<pid>\d+|'<unknown>'|<unknown>)\s*,\s*")
_NAME_RE = re.compile(r"^name=(?P<name>.*?)(?:\s*,\s*|$)")
_RECOVERY_RE = re.compile(
    r"recovery action changed from\s+(?P<from_code>0x[0-9A-Fa-f]+)\s*\((?P<from_name>[^)]*)\)"
    r"\s+to\s+(?P<to_code>0x[0-9A-Fa-f]+)\s*\((?P<to_name>[^)]*)\)"
)
_DMESG_TS_RE = re.compile(r"^\s*\[\s*(?P<ts>\d+\.\d+)\]")


@dataclass(frozen=True)
class XidEvent:
    xid: int
    gpu: str  # PCI bus id as the driver prints it, e.g. "0000:3b:00"
    message: str
    pid: int | None = None
    process_name: str | None = None
    recovery_action: str | None = None  # XID 154: the action it changed *to*
    raw: str = ""

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("raw")
        return data


def parse_xid_line(line: str) -> XidEvent | None:
    """One log line to an XidEvent, or None when it is not an XID line."""
    match = _XID_RE.search(line.rstrip("\n"))
    if match is None:
        return None
    rest = (match.group("rest") or "").strip()
    pid: int | None = None
    name: str | None = None
    pid_match = _PID_RE.match(rest)
    if pid_match:
        pid_text = pid_match.group("pid")
        pid = int(pid_text) if pid_text.isdigit() else None
        rest = rest[pid_match.end() :]
        name_match = _NAME_RE.match(rest)
        if name_match:
            name = name_match.group("name").strip().strip("'")
            name = None if name in ("", "<unknown>") else name
            rest = rest[name_match.end() :]
    recovery = _RECOVERY_RE.search(rest)
    return XidEvent(
        xid=int(match.group("code")),
        gpu=match.group("pci").lower(),
        message=rest.strip(),
        pid=pid,
        process_name=name,
        recovery_action=recovery.group("to_name").strip() if recovery else None,
        raw=line.strip(),
    )


def parse_xid_lines(lines: Iterable[str]) -> list[XidEvent]:
    return [event for line in lines if (event := parse_xid_line(line)) is not None]


def xid_condition(events: Sequence[XidEvent], now: float) -> Condition:
    """XidError is true when new XIDs were seen since the last collection."""
    ctype = ConditionType.XID_ERROR.value
    if not events:
        return healthy(ctype, now, "no new XID errors", {"xids": [], "gpus": []})
    xids = sorted({e.xid for e in events})
    gpus = sorted({e.gpu for e in events})
    details: dict[str, Any] = {
        "xids": xids,
        "gpus": gpus,
        "events": [e.to_dict() for e in events[-50:]],  # bounded: a storm must not bloat events
        "count": len(events),
    }
    actions = [e.recovery_action for e in events if e.recovery_action]
    if actions:
        details["recovery_action"] = actions[-1]
    last = events[-1]
    summary = ", ".join(str(x) for x in xids)
    return problem(ctype, now, f"XID {summary} on {', '.join(gpus)}: {last.message}"[:300], details)


# --------------------------------------------------------------------------- cursors


@dataclass
class FileCursor:
    """Where we stopped reading a log file. A new inode or a shorter file means rotation."""

    path: str
    inode: int = 0
    offset: int = 0

    def read_new_lines(self, max_bytes: int = 16 * 1024 * 1024) -> list[str]:
        try:
            stat = os.stat(self.path)
        except FileNotFoundError as exc:
            raise ProbeError(f"kernel log {self.path} not found") from exc
        except OSError as exc:
            raise ProbeError(f"cannot stat kernel log {self.path}: {exc.strerror}") from exc
        if stat.st_ino != self.inode or stat.st_size < self.offset:
            self.inode, self.offset = stat.st_ino, 0
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                chunk = handle.read(max_bytes)
        except OSError as exc:
            raise ProbeError(f"cannot read kernel log {self.path}: {exc.strerror}") from exc
        # Only consume whole lines: a line being written now is read next time.
        end = chunk.rfind(b"\n") + 1
        self.offset += end
        return chunk[:end].decode("utf-8", errors="replace").splitlines()


@dataclass
class DmesgCursor:
    """Last kernel timestamp seen in ``dmesg`` output, valid only within one boot."""

    boot_id: str = ""
    last_ts: float = -1.0
    seen_untimed: list[str] = field(default_factory=list)

    def new_lines(self, output: str, boot_id: str) -> list[str]:
        if boot_id != self.boot_id:
            self.boot_id, self.last_ts, self.seen_untimed = boot_id, -1.0, []
        fresh: list[str] = []
        max_ts = self.last_ts
        for line in output.splitlines():
            match = _DMESG_TS_RE.match(line)
            if match:
                ts = float(match.group("ts"))
                if ts > self.last_ts:
                    fresh.append(line)
                    max_ts = max(max_ts, ts)
            elif line not in self.seen_untimed:
                fresh.append(line)
                self.seen_untimed.append(line)
                del self.seen_untimed[:-1000]
        self.last_ts = max_ts
        return fresh


def read_boot_id(path: str = "/proc/sys/kernel/random/boot_id") -> str:
    try:
        with open(path, encoding="ascii") as handle:
            return handle.read().strip()
    except OSError:
        return ""


@dataclass
class XidSource:
    """Reads new XID events from a log file or from dmesg, persisting its cursor if asked.

    ``source`` is ``"dmesg"`` or a path such as ``/var/log/kern.log``.
    """

    source: str
    cursor_path: str | None = None
    dmesg_path: str = "dmesg"
    timeout_s: float = 10.0
    file_cursor: FileCursor | None = None
    dmesg_cursor: DmesgCursor | None = None

    def __post_init__(self) -> None:
        self._load()

    def read_new(self, runner: Runner, *, commit: bool = True) -> list[XidEvent]:
        """New events since the cursor. With ``commit=False`` the cursor moves in memory only and
        is persisted by ``commit()`` once the events were delivered, so a crash or a failed
        delivery re-reads them instead of losing them."""
        if self.source == "dmesg":
            result = runner([self.dmesg_path], self.timeout_s)
            if result.returncode != 0:
                tail = (result.stderr or result.stdout).strip()[-200:]
                raise ProbeError(f"dmesg exited {result.returncode}: {tail}")
            assert self.dmesg_cursor is not None
            lines = self.dmesg_cursor.new_lines(result.stdout, read_boot_id())
        else:
            assert self.file_cursor is not None
            lines = self.file_cursor.read_new_lines()
        if commit:
            self.commit()
        return parse_xid_lines(lines)

    def commit(self) -> None:
        self._save()

    def _load(self) -> None:
        state: dict[str, Any] = {}
        if self.cursor_path and os.path.exists(self.cursor_path):
            try:
                with open(self.cursor_path, encoding="utf-8") as handle:
                    loaded = json.load(handle)
                if isinstance(loaded, dict) and loaded.get("source") == self.source:
                    state = loaded
            except (OSError, ValueError):
                state = {}  # a corrupt cursor re-reads the log: duplicates beat missed XIDs
        if self.source == "dmesg":
            self.dmesg_cursor = DmesgCursor(
                boot_id=str(state.get("boot_id", "")),
                last_ts=float(state.get("last_ts", -1.0)),
            )
        else:
            self.file_cursor = FileCursor(
                self.source, inode=int(state.get("inode", 0)), offset=int(state.get("offset", 0))
            )

    def _save(self) -> None:
        if not self.cursor_path:
            return
        state: dict[str, Any] = {"source": self.source}
        if self.dmesg_cursor is not None:
            state.update(boot_id=self.dmesg_cursor.boot_id, last_ts=self.dmesg_cursor.last_ts)
        if self.file_cursor is not None:
            state.update(inode=self.file_cursor.inode, offset=self.file_cursor.offset)
        tmp = f"{self.cursor_path}.tmp"
        os.makedirs(os.path.dirname(os.path.abspath(self.cursor_path)), exist_ok=True)
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump(state, handle)
        os.replace(tmp, self.cursor_path)
