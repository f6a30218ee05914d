"""mtc's extension to CustomJobs: a worker's output, read by byte offset
(``GET .../customJobs/{id}/logs``)."""

from __future__ import annotations

from pydantic import Field

from services.api.wire.proto_json import Int32, Message


class ReadCustomJobLogsResponse(Message):
    """One page of one rank's output of one attempt.

    ``nextPageToken`` resumes after the last byte this page returned; it is empty only once
    the log is complete (its attempt ended and every line was read), so a follower polls
    with it until then. ``rank`` is absent where one file holds every rank (Slurm)."""

    lines: list[str] = Field(default_factory=list, description="the lines, without newlines")
    next_page_token: str = ""
    attempt: Int32 = Field(0, description="the attempt these lines are of (0: none started)")
    rank: Int32 | None = None
    latest_attempt: Int32 = Field(0, description="the job's newest attempt with a log")
