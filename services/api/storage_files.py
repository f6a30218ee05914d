"""Cloud Storage objects as files: bucket ``B``'s object ``P`` is ``<output root>/gcs/B/P``,
the tree jobs see at ``/gcs/B/P`` and write their outputs into (``services.api.storage``
serves it with Google's JSON API).

Names are checked before any path is made: a bucket name as Google's rules have it; an object
name of at most 1024 UTF-8 bytes whose ``/``-separated segments are never empty, ``.`` or
``..``, with no NUL or other control character (so it can never leave its bucket's
directory). Every open walks the path one directory at a time with ``O_NOFOLLOW`` from the
bucket's own directory: a symbolic link a job left in its outputs is never followed, so the
API never reads or writes outside the bucket, whatever a job put there.

A write goes to a temporary file under ``<output root>/.gcs-uploads`` (not in any bucket, so
no job and no listing sees it half written) and is renamed into place: readers see the old
object or the new one. A full disk is ``StorageFull`` (503 with Retry-After), with nothing
kept.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import os
import re
import secrets
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import google_crc32c

from services.api.errors import ApiError, invalid
from shared.domain.errors import StorageFull

BUCKET_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]")
MAX_NAME_BYTES = 1024
UPLOADS = ".gcs-uploads"  # beside ``gcs/``: a job id never starts with a dot
CHUNK = 1 << 20
_FULL = (errno.ENOSPC, errno.EDQUOT)


@dataclass(frozen=True)
class Stat:
    size: int
    mtime_ns: int
    inode: int


def check_bucket(name: str, field: str = "bucket") -> str:
    if not BUCKET_NAME.fullmatch(name) or ".." in name:
        raise invalid(field, f"{name!r} is not a bucket name: 3-63 lowercase letters, digits, "
                      "'-', '_' or '.', starting and ending with a letter or digit")
    return name


def check_object(name: str, field: str = "name") -> list[str]:
    """The object name's path segments, or a 400 naming ``field``."""
    if not name:
        raise invalid(field, "an object name is required")
    if len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        raise invalid(field, f"is longer than {MAX_NAME_BYTES} bytes")
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise invalid(field, "holds a NUL or another control character")
    if name.startswith("/"):
        raise invalid(field, f"{name!r} starts with '/': object names are relative to the "
                      "bucket")
    if name.endswith("/"):
        raise invalid(field, f"{name!r} ends with '/': a folder placeholder is not an object "
                      "here (folders exist when objects are in them)")
    parts = name.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise invalid(field, f"{name!r} has an empty, '.' or '..' segment: the name must stay "
                      "inside its bucket")
    return parts


def file_sums(path: Path) -> tuple[str, str]:
    """A file's MD5 and CRC32C, base64, as Google gives them."""
    with open(path, "rb") as f:
        return _digest(f)


def _digest(f: IO[bytes]) -> tuple[str, str]:
    md5 = hashlib.md5(usedforsecurity=False)
    crc: Any = google_crc32c.Checksum()  # type: ignore[no-untyped-call]
    while chunk := f.read(CHUNK):
        md5.update(chunk)
        crc.update(chunk)
    return base64.b64encode(md5.digest()).decode(), base64.b64encode(crc.digest()).decode()


def _full(exc: OSError, where: Path) -> StorageFull:
    return StorageFull(f"no space left for Cloud Storage objects under {where} "
                       f"({os.strerror(exc.errno or 0)}); nothing was kept")


class Tree:
    """The ``gcs/`` tree of one output root."""

    def __init__(self, output_root: Path) -> None:
        self.root = Path(output_root) / "gcs"
        self.uploads = Path(output_root) / UPLOADS
        self._sums: dict[tuple[str, Stat], tuple[str, str]] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------ reading

    def bucket_dir(self, bucket: str) -> Path:
        return self.root / check_bucket(bucket)

    @contextmanager
    def _dir_fd(self, bucket: str, parts: list[str], *, make: bool = False) -> Iterator[int]:
        """A descriptor of the directory ``parts`` inside the bucket, every step without
        following a link (``make``: the missing ones are made); FileNotFoundError when a
        step is missing or is not a directory."""
        base = self.bucket_dir(bucket)
        if make:
            base.mkdir(parents=True, exist_ok=True)
        fd = _open_dir(str(base))
        try:
            for part in parts:
                if make:
                    with suppress(FileExistsError):
                        os.mkdir(part, 0o755, dir_fd=fd)
                nxt = _open_dir(part, fd)
                os.close(fd)
                fd = nxt
            yield fd
        finally:
            os.close(fd)

    @contextmanager
    def open(self, bucket: str, name: str) -> Iterator[tuple[IO[bytes], Stat]]:
        """The object's content, open, and its stat; FileNotFoundError: no such object."""
        parts = check_object(name, "object")
        with self._dir_fd(bucket, parts[:-1]) as dfd:
            try:
                fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dfd)
            except OSError as exc:
                if exc.errno in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR):
                    raise FileNotFoundError(name) from None
                raise
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):  # a folder, a FIFO: no object of that name
                raise FileNotFoundError(name)
            yield f, Stat(st.st_size, st.st_mtime_ns, st.st_ino)

    def stat(self, bucket: str, name: str) -> Stat:
        with self.open(bucket, name) as (_, st):
            return st

    def sums(self, bucket: str, name: str) -> tuple[Stat, str, str]:
        """The object's stat, MD5 and CRC32C (base64, as Google gives them), remembered by
        path, size, mtime and inode so a listing does not read every object again."""
        with self.open(bucket, name) as (f, st):
            key = (f"{bucket}/{name}", st)
            with self._lock:
                known = self._sums.get(key)
            if known is not None:
                return st, *known
            out = _digest(f)
            with self._lock:
                if len(self._sums) > 4096:
                    self._sums.clear()
                self._sums[key] = out
            return st, *out

    def remember(self, bucket: str, name: str, st: Stat, sums: tuple[str, str]) -> None:
        """The sums of an object just written (computed on its way in: not read again)."""
        with self._lock:
            self._sums[(f"{bucket}/{name}", st)] = sums

    def walk(self, bucket: str, prefix: str = "") -> Iterator[str]:
        """Every object name in the bucket under ``prefix``, in name order (regular files
        only: links and whatever else a job left are not objects)."""
        start = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        parts = start.split("/") if start else []
        if any(p in ("", ".", "..") for p in parts):
            return
        try:
            with self._dir_fd(bucket, parts) as fd:
                yield from (n for n in self._walk_fd(fd, start) if n.startswith(prefix))
        except FileNotFoundError:
            return

    def _walk_fd(self, fd: int, at: str) -> Iterator[str]:
        try:
            entries = sorted(os.scandir(fd), key=lambda e: e.name)
        except OSError:
            return
        for entry in entries:
            name = f"{at}/{entry.name}" if at else entry.name
            if entry.is_dir(follow_symlinks=False):
                try:
                    sub = os.open(entry.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW,
                                  dir_fd=fd)
                except OSError:
                    continue
                try:
                    # "a/b" sorts after "a-c" by name, as Google lists: the segment plus "/"
                    yield from self._walk_fd(sub, name)
                finally:
                    os.close(sub)
            elif entry.is_file(follow_symlinks=False):
                yield name

    # ------------------------------------------------------------ writing

    def temp(self) -> tuple[Path, IO[bytes]]:
        """A new temporary file for an upload's content (not in any bucket)."""
        self.uploads.mkdir(parents=True, exist_ok=True)
        path = self.uploads / f"tmp-{secrets.token_hex(12)}"
        return path, open(path, "xb")

    def write_stream(self, out: IO[bytes], source: IO[bytes], limit: int | None = None
                     ) -> int:
        """Copy ``source`` into ``out`` (at most ``limit`` bytes); the count copied."""
        done = 0
        try:
            while limit is None or done < limit:
                want = CHUNK if limit is None else min(CHUNK, limit - done)
                chunk = source.read(want)
                if not chunk:
                    break
                out.write(chunk)
                done += len(chunk)
            out.flush()
        except OSError as exc:
            if exc.errno in _FULL:
                raise _full(exc, self.root) from None
            raise
        return done

    def commit(self, temp: Path, bucket: str, name: str) -> Stat:
        """Rename ``temp`` into place as the object (made durable first); a name whose
        folder is an object, or an object that is a folder, is a 409."""
        parts = check_object(name, "name")
        try:
            with open(temp, "rb+") as f:
                os.fsync(f.fileno())
            os.chmod(temp, 0o644)
            with self._dir_fd(bucket, parts[:-1], make=True) as dfd:
                try:
                    if stat.S_ISDIR(os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False)
                                    .st_mode):
                        raise _conflict(name, "is a folder of other objects")
                except FileNotFoundError:
                    pass
                os.rename(temp, parts[-1], dst_dir_fd=dfd)
                st = os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:  # a step of the name is an object, not a folder
            temp.unlink(missing_ok=True)
            raise _conflict(name, "lies under an object of the same name as a folder") from None
        except OSError as exc:
            temp.unlink(missing_ok=True)
            if exc.errno in _FULL:
                raise _full(exc, self.root) from None
            if exc.errno in (errno.ENOTDIR, errno.EISDIR):  # made meanwhile by a job
                raise _conflict(name, "lies under an object of the same name as a folder"
                                ) from None
            raise
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
        return Stat(st.st_size, st.st_mtime_ns, st.st_ino)

    def delete(self, bucket: str, name: str) -> None:
        """Remove the object; FileNotFoundError: none. Its folders stay: a running job may
        be about to write into them."""
        parts = check_object(name, "object")
        self.stat(bucket, name)  # a regular file, reached without links
        with self._dir_fd(bucket, parts[:-1]) as dfd:
            os.unlink(parts[-1], dir_fd=dfd)


def _open_dir(path: str, dir_fd: int | None = None) -> int:
    """A directory's descriptor, never through a link; FileNotFoundError when it is missing,
    a link or not a directory."""
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR):
            raise FileNotFoundError(path) from None
        raise


def _conflict(name: str, why: str) -> ApiError:
    return ApiError("ALREADY_EXISTS", f"name: {name!r} {why}; choose another name",
                    http=409)
