"""One checkpoint entry on one tier: how it is written (atomically, manifest last) and how a
reader tells a complete entry from a torn one. numpy and the standard library only.

Tiers 1 and 2 (node memory, the peer copy) hold an entry per step as a directory
``step-<step:010d>/`` with ``payload.npz`` and ``manifest.json``. It is built under a
temporary name (``.tmp-...``): payload written and fsynced, then the manifest (step, rank,
world size, the payload's size and sha256) written and fsynced last, then the directory
renamed into place. A reader uses an entry only if its manifest parses, names the step of
the directory, and the payload has the manifest's size and hash: an entry without a
manifest, with a bad hash or a truncated payload is skipped, whatever crashed when.

Tier 3 (durable) keeps the worker protocol's format, so the adapters' scan
(``checkpoint_steps``) and every program that reads ``ckpt-<step:08d>.npz`` keep working:
the npz appears by rename (the protocol's commit point) with its ``.save_s`` written before
it, then ``<name>.manifest.json`` beside it. A durable npz with a manifest must match its
hash; one without (a program that writes the protocol's npz itself, or a crash between the rename and the
manifest) is used if every member reads back (the zip's CRC-32 checks each one).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import tempfile
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mtc_program.protocol import (
    DURABLE,
    DURABLE_RE,
    ENTRY_RE,
    MANIFEST,
    MANIFEST_SUFFIX,
    PAYLOAD,
    SAVE_S_SUFFIX,
    checkpoint_name,
    entry_name,
)

FORMAT = 1
BYTES_PREFIX = "__bytes__"  # a bytes value travels as a uint8 array under this prefix

State = Mapping[str, "np.ndarray | bytes"]


@dataclass(frozen=True)
class Entry:
    """A complete-looking entry (its manifest parsed); ``verify`` checks the payload."""

    tier: str
    step: int
    rank: int
    world_size: int
    path: Path  # the payload file
    sha256: str | None  # None: a durable npz without a manifest
    size: int | None


def encode(state: State) -> bytes:
    """The payload: an uncompressed npz of the named arrays (bytes as uint8 arrays)."""
    arrays: dict[str, np.ndarray] = {}
    for name, value in state.items():
        if isinstance(value, bytes | bytearray | memoryview):
            arrays[BYTES_PREFIX + name] = np.frombuffer(bytes(value), dtype=np.uint8)
        else:
            arrays[name] = np.asarray(value)
    buf = io.BytesIO()
    np.savez(buf, **arrays)  # type: ignore[arg-type]
    return buf.getvalue()


def decode(payload: bytes | Path) -> dict[str, np.ndarray | bytes]:
    """The state back from a payload (every member read: the zip checks each CRC)."""
    source = io.BytesIO(payload) if isinstance(payload, bytes) else payload
    out: dict[str, np.ndarray | bytes] = {}
    with np.load(source, allow_pickle=False) as z:
        for name in z.files:
            value = z[name]
            if name.startswith(BYTES_PREFIX):
                out[name[len(BYTES_PREFIX):]] = value.tobytes()
            else:
                out[name] = value
    return out


def fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):  # some file systems cannot fsync a directory
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


def atomic_file(path: Path, data: bytes) -> None:
    """``data`` at ``path`` by temp file, fsync and rename: whole or not at all."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def manifest(step: int, rank: int, world_size: int, payload: bytes) -> dict[str, object]:
    return {"format": FORMAT, "step": step, "rank": rank, "world_size": world_size,
            "size": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}


def write_entry(directory: Path, step: int, rank: int, world_size: int, payload: bytes) -> Path:
    """Write a tier-1/2 entry atomically (see the module docstring); returns its directory.
    An entry of the same step already there is replaced whole."""
    directory.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{entry_name(step)}-", dir=directory))
    final = directory / entry_name(step)
    try:
        _write_file(tmp / PAYLOAD, payload)
        _write_file(tmp / MANIFEST, json.dumps(manifest(step, rank, world_size, payload)).encode())
        fsync_dir(tmp)
        if final.exists():  # the same step again (after a restore): the old one leaves first
            old = directory / f".old-{final.name}-{os.getpid()}"
            os.replace(final, old)
            shutil.rmtree(old, ignore_errors=True)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fsync_dir(directory)
    return final


def write_durable(directory: Path, step: int, rank: int, world_size: int, payload: bytes,
                  save_s: float | None = None) -> Path:
    """The durable entry in the protocol's format: ``.save_s`` (if given), then the npz by
    rename, then its manifest."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / checkpoint_name(step, ".npz")
    if save_s is not None:
        atomic_file(path.with_name(path.name + SAVE_S_SUFFIX), f"{max(save_s, 1e-6):.6f}\n".encode())
    atomic_file(path, payload)
    atomic_file(path.with_name(path.name + MANIFEST_SUFFIX),
                json.dumps(manifest(step, rank, world_size, payload)).encode())
    return path


def _read_manifest(path: Path) -> dict[str, object] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return None
    ints = ("step", "rank", "world_size", "size")
    if not all(isinstance(data.get(k), int) for k in ints) or not isinstance(data.get("sha256"), str):
        return None
    return data


def list_entries(directory: Path, tier: str) -> list[Entry]:
    """The tier-1/2 entries of ``directory`` whose manifest parses, newest step first."""
    out: list[Entry] = []
    try:
        children = list(directory.iterdir())
    except OSError:
        return out
    for child in children:
        m = ENTRY_RE.match(child.name)
        if not m:
            continue
        data = _read_manifest(child / MANIFEST)
        if data is None or data["step"] != int(m.group(1)):
            continue
        out.append(Entry(tier, int(m.group(1)), int(data["rank"]),  # type: ignore[call-overload]
                         int(data["world_size"]), child / PAYLOAD,  # type: ignore[call-overload]
                         str(data["sha256"]), int(data["size"])))  # type: ignore[call-overload]
    return sorted(out, key=lambda e: e.step, reverse=True)


def list_durable(directory: Path, rank: int, world_size: int) -> list[Entry]:
    """The durable ``ckpt-<step>.npz`` files, newest first (a missing manifest: rank 0's,
    hash unknown; ``verify`` then reads every member)."""
    out: list[Entry] = []
    try:
        children = list(directory.iterdir())
    except OSError:
        return out
    for child in children:
        m = DURABLE_RE.match(child.name)
        if not m:
            continue
        data = _read_manifest(child.with_name(child.name + MANIFEST_SUFFIX))
        if data is not None and data["step"] != int(m.group(1)):
            continue
        if data is None:
            out.append(Entry(DURABLE, int(m.group(1)), 0, world_size, child, None, None))
        else:
            out.append(Entry(DURABLE, int(m.group(1)), int(data["rank"]),  # type: ignore[call-overload]
                             int(data["world_size"]), child,  # type: ignore[call-overload]
                             str(data["sha256"]), int(data["size"])))  # type: ignore[call-overload]
    return sorted(out, key=lambda e: e.step, reverse=True)


def check(entry: Entry) -> tuple[bytes | None, str]:
    """The entry's payload if it is whole (size and hash as the manifest says; a durable
    npz without a manifest: a zip whose every member reads back), else None and why not."""
    try:
        payload = entry.path.read_bytes()
    except OSError as exc:
        return None, f"unreadable ({exc.strerror or exc})"
    if entry.sha256 is None:
        try:
            with zipfile.ZipFile(io.BytesIO(payload)) as z:
                bad = z.testzip()
        except (zipfile.BadZipFile, OSError, ValueError) as exc:
            return None, f"not a readable npz ({exc})"
        return (None, f"member {bad} fails its CRC") if bad is not None else (payload, "")
    if len(payload) != entry.size:
        return None, f"{len(payload)} bytes where its manifest says {entry.size}"
    if hashlib.sha256(payload).hexdigest() != entry.sha256:
        return None, "sha256 does not match its manifest"
    return payload, ""


def verify(entry: Entry) -> bytes | None:
    """``check`` without the reason."""
    return check(entry)[0]


def prune(directory: Path, keep: int) -> list[int]:
    """Keep the newest ``keep`` entries of a tier-1/2 directory (and drop temp leftovers of
    crashed writes); returns the steps removed."""
    removed: list[int] = []
    try:
        children = list(directory.iterdir())
    except OSError:
        return removed
    steps = sorted((int(m.group(1)), c) for c in children if (m := ENTRY_RE.match(c.name)))
    for step, child in steps[:-keep] if keep > 0 else steps:
        shutil.rmtree(child, ignore_errors=True)
        removed.append(step)
    for child in children:
        if child.name.startswith((".tmp-", ".old-")) and child.is_dir():
            shutil.rmtree(child, ignore_errors=True)
    return removed


def prune_durable(directory: Path, keep: int) -> list[int]:
    """Keep the newest ``keep`` durable checkpoints (with their ``.save_s`` and manifest)."""
    removed: list[int] = []
    try:
        found = sorted((int(m.group(1)), c) for c in directory.iterdir()
                       if (m := DURABLE_RE.match(c.name)))
    except OSError:
        return removed
    for step, path in found[:-keep] if keep > 0 else []:
        for p in (path, path.with_name(path.name + SAVE_S_SUFFIX),
                  path.with_name(path.name + MANIFEST_SUFFIX)):
            with contextlib.suppress(OSError):
                p.unlink()
        removed.append(step)
    return removed
