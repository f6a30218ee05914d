"""Where a compute adapter keeps its workers' output, and reading it by byte offset.

Local compute: one file per attempt and rank, ``<state>/logs/<job>/attempt-<n>-rank-<r>.log``
(opened for append by the launcher; a restart is a new attempt, so a new file: earlier
attempts' logs stay). Slurm: one file for every attempt and rank of a job,
``<state>/logs/<job>/slurm.out`` (``sbatch --open-mode=append``), named in each attempt's
record; its ``LogFile.rank`` is ``None`` (every rank, interleaved as Slurm writes them).

Reading is by byte offset, so a reader can come back for what was appended since
(``read_lines``): a page holds whole lines only, except the pieces of a line longer than
``MAX_LINE_BYTES`` and a last line without a newline once its writer has ended.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import NamedTuple, Protocol, runtime_checkable

MAX_PAGE_BYTES = 1 << 20
MAX_LINE_BYTES = 1 << 15  # a longer line comes in pieces of this size


class LogFile(NamedTuple):
    attempt: int
    rank: int | None  # None: one file for every rank of the attempt
    path: str
    ended: bool  # its writer has exited: nothing more will be appended


@runtime_checkable
class WorkerLogs(Protocol):
    """A compute adapter that can say where its workers' output is."""

    def log_files(self, job_id: str) -> Sequence[LogFile]: ...


class Page(NamedTuple):
    lines: list[str]
    offset: int  # where the next read starts
    at_end: bool  # nothing more in the file now


def read_lines(path: str, offset: int, *, max_lines: int, ended: bool,
               max_bytes: int = MAX_PAGE_BYTES) -> Page:
    """Up to ``max_lines`` lines (and ``max_bytes``) from byte ``offset`` of ``path``; a line
    longer than ``MAX_LINE_BYTES`` comes in pieces; a file not written yet reads as empty.
    ValueError when ``offset`` is past the file's end."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if offset > size:
                raise ValueError(f"offset {offset} is past the end of the log ({size} bytes)")
            f.seek(offset)
            data = f.read(min(max_bytes, size - offset))
    except FileNotFoundError:
        if offset:
            raise ValueError(f"offset {offset} is past the end of the log (0 bytes)") from None
        return Page([], 0, True)
    lines: list[bytes] = []
    used = 0
    while len(lines) < max_lines and used < len(data):
        newline = data.find(b"\n", used, used + MAX_LINE_BYTES + 1)
        if newline >= 0:
            lines.append(data[used:newline])
            used = newline + 1
        elif len(data) - used >= MAX_LINE_BYTES:  # a line too long for one: a piece of it
            lines.append(data[used:used + MAX_LINE_BYTES])
            used += MAX_LINE_BYTES
        elif ended and offset + len(data) == size:  # the last line, never terminated
            lines.append(data[used:])
            used = len(data)
        else:  # a line still being written: the next read gets it whole
            break
    end = offset + used
    text = [c.decode("utf-8", errors="replace").removesuffix("\r") for c in lines]
    return Page(text, end, end >= size or not lines)


TAIL_LINES = 5
TAIL_CHARS = 800


def tail_note(path: str | None, rank: int | None, *, lines: int = TAIL_LINES,
              max_chars: int = TAIL_CHARS) -> str:
    """The last non-blank lines a failed rank wrote, as a note for its attempt's exit (the
    job's error says why, as Vertex's does), bounded; "" when there is nothing to show."""
    if not path:
        return ""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(max(0, size - 8 * max_chars))
            data = f.read()
    except OSError:
        return ""
    text = [ln.strip() for ln in data.decode("utf-8", errors="replace").splitlines()]
    last = [ln for ln in text if ln][-lines:]
    if not last:
        return ""
    body = " | ".join(last)
    if len(body) > max_chars:
        body = "..." + body[-max_chars:]
    who = f"rank {rank}" if rank is not None else "the workers"
    return f"; {who}'s last output: {body}"
