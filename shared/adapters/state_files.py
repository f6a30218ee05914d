"""The embedded state directory as files: check it before serving, back it up online, restore
it while nothing runs over it.

A state directory holds the control plane's database (``mtc.db``), the compute ledger of its
backend (``compute/*.sqlite3``), the API tokens and the jobs' output (``jobs/``). They must
agree: an emptied ``mtc.db`` beside a ledger that knows workers, or a database whose own
integrity check fails, would start a server that silently forgets (or writes into) a fleet.
``check`` finds that; ``backup`` copies the databases through sqlite's online backup API (a
consistent copy while the server runs) plus the token file; ``restore`` puts a backup back.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from shared.adapters.private_files import private_dir, private_file
from shared.domain.errors import StateError

STATE_DB = "mtc.db"
COMPUTE_DIR = "compute"
JOBS_DIR = "jobs"
TOKENS = "api-tokens.json"
MANIFEST = "mtc-backup.json"
RECOVERY = ("`mtc --state-dir {dir} state check` lists what is wrong; `mtc --state-dir {dir} "
            "state restore BACKUP` puts a backup (from `mtc state backup`) back")


@dataclass(frozen=True)
class Finding:
    """One thing wrong with a state file: which file, and what."""

    path: Path
    problem: str

    def __str__(self) -> str:
        return f"{self.path} {self.problem}"


def databases(state_dir: Path) -> list[Path]:
    """The sqlite files of a state directory: the state database and the compute ledgers."""
    ledgers = sorted((state_dir / COMPUTE_DIR).glob("*.sqlite3")) \
        if (state_dir / COMPUTE_DIR).is_dir() else []
    return [state_dir / STATE_DB, *ledgers]


def check(state_dir: Path, *, integrity: bool = True) -> list[Finding]:
    """What is wrong with ``state_dir`` (empty: nothing found). A directory never used is fine.
    ``integrity``: also run each database's own quick check (reads every page: a server's
    start and ``mtc state check`` do; a CLI command's open does only the cheap agreement)."""
    found: list[Finding] = []
    state_db = state_dir / STATE_DB
    for db in databases(state_dir) if integrity else ():
        if db.exists():
            problem = _integrity(db)
            if problem is not None:
                found.append(Finding(db, problem))
    blank = not state_db.exists() or state_db.stat().st_size == 0
    used = _used_elsewhere(state_dir) if blank else ""
    if used:
        found.append(Finding(state_db, f"is {'missing' if not state_db.exists() else 'empty'} "
                             f"while {used}: the control plane would forget that fleet"))
    tokens = state_dir / TOKENS
    if tokens.exists():
        way_out = ("restore it from a backup, or move it aside and mint tokens again with "
                   "`mtc token create`")
        try:
            data = json.loads(tokens.read_text(encoding="utf-8"))
            if not isinstance(data, dict) or not isinstance(data.get("tokens"), list):
                found.append(Finding(tokens, f"is damaged (not a token file); {way_out}"))
        except (OSError, ValueError, RecursionError) as exc:
            found.append(Finding(tokens, f"is damaged ({exc}); {way_out}"))
    return found


def refuse_if_damaged(state_dir: Path, *, integrity: bool) -> None:
    """Raise ``StateError`` naming each damaged file and the recovery commands."""
    found = check(state_dir, integrity=integrity)
    if found:
        raise StateError("the state directory cannot be used as it is:\n  "
                         + "\n  ".join(map(str, found)) + "\n" + RECOVERY.format(dir=state_dir))


def _integrity(db: Path) -> str | None:
    """sqlite's own quick check, read-only; None when the file is a sound database."""
    if db.stat().st_size == 0:
        return None  # an empty file is judged against the rest (``check``)
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10.0)
        try:
            rows = conn.execute("PRAGMA quick_check").fetchall()
        finally:
            conn.close()
    except sqlite3.Error as exc:
        return f"is not a sound sqlite database ({exc})"
    verdict = [str(r[0]) for r in rows]
    return None if verdict == ["ok"] else "fails its integrity check: " + "; ".join(verdict[:3])


def _used_elsewhere(state_dir: Path) -> str:
    """What besides the state database says this directory ran a fleet ('' if nothing)."""
    for ledger in databases(state_dir)[1:]:
        if ledger.stat().st_size > 0 and _rows(ledger) > 0:
            return f"{ledger} still records workers and nodes"
    jobs = state_dir / JOBS_DIR
    # (an empty file system of their own has its lost+found: volume.py)
    if jobs.is_dir() and any(p.name != "lost+found" for p in jobs.iterdir()):
        return f"{jobs} holds jobs' output"
    return ""


def _rows(db: Path) -> int:
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10.0)
        try:
            tables = [r[0] for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type='table'")]
            return sum(int(conn.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0])
                       for t in tables)
        finally:
            conn.close()
    except sqlite3.Error:
        return 1  # unreadable: judged by its integrity check, but it is not nothing


def backup(state_dir: Path, dest: Path) -> list[Path]:
    """Copy the databases (sqlite's online backup: consistent while a server writes) and the
    token file into ``dest``, which must not exist yet; returns the files written."""
    if dest.exists():
        raise FileExistsError(f"{dest} exists; a backup goes into a new directory")
    private_dir(dest)
    written: list[Path] = []
    for db in databases(state_dir):
        if not db.exists():
            continue
        target = dest / db.relative_to(state_dir)
        private_dir(target.parent)
        private_file(target)
        src = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30.0)
        out = sqlite3.connect(target)
        try:
            src.backup(out)
        finally:
            out.close()
            src.close()
        written.append(target)
    if (state_dir / TOKENS).exists():
        shutil.copy2(state_dir / TOKENS, dest / TOKENS)
        written.append(dest / TOKENS)
    (dest / MANIFEST).write_text(json.dumps(
        {"files": [str(p.relative_to(dest)) for p in written]}, indent=1) + "\n",
        encoding="utf-8")
    return written


def restore(backup_dir: Path, state_dir: Path) -> list[Path]:
    """Put a backup back (no server may run over ``state_dir``): each file it holds replaces
    the state's, whose -wal and -shm go with it; the damaged ones are kept beside as
    ``*.damaged``. Returns the files restored."""
    manifest = backup_dir / MANIFEST
    if not manifest.exists():
        raise FileNotFoundError(f"{backup_dir} is not a backup (no {MANIFEST})")
    names = json.loads(manifest.read_text(encoding="utf-8"))["files"]
    problems = [f for f in check(backup_dir) if f.path.name != STATE_DB or f.path.exists()]
    if problems:
        raise ValueError("the backup itself is damaged: " + "; ".join(map(str, problems)))
    restored: list[Path] = []
    private_dir(state_dir)
    for name in names:
        target = state_dir / name
        private_dir(target.parent)
        for suffix in ("-wal", "-shm"):
            target.with_name(target.name + suffix).unlink(missing_ok=True)
        if target.exists():
            target.replace(target.with_name(target.name + ".damaged"))
        shutil.copy2(backup_dir / name, target)
        private_file(target)
        restored.append(target)
    return restored
