"""`mtc job logs` (a worker's output, locally or through the API) and `mtc tensorboard` (the
real TensorBoard on a job's or a tuning job's event files, on this machine)."""

from __future__ import annotations

import argparse
import collections
import contextlib
import importlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from services.api.errors import ApiError
from services.api.names import Parent, parent
from services.cli.client import Client, ClientError
from services.job_submission.scheduling import output_dirs
from services.wiring.embedded import EmbeddedApp

TERMINAL = {"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED",
            "JOB_STATE_EXPIRED"}
FOLLOW_POLL_S = 0.5


# ---------------------------------------------------------------- mtc job logs


def cmd_job_logs(args: argparse.Namespace, client: Client, *,
                 out: Callable[[str], None] | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
    """Print one rank's output of one attempt (default: rank 0 of the newest); ``--tail N``
    only its last N lines; ``--follow`` keeps polling from the last byte offset, moves on to
    the next attempt when the job restarts (unless ``--attempt`` pins one), and ends when the
    job has ended and its last attempt's log is read."""
    write = out or _print
    if args.tail is not None and args.tail < 0:
        raise ClientError("INVALID_ARGUMENT", "--tail: must be >= 0", [("--tail", ">= 0")])
    attempt, token, complete = args.attempt, None, False
    tail: collections.deque[str] | None = None
    if args.tail is not None:
        tail = collections.deque(maxlen=args.tail)
    while True:
        if complete:  # this attempt's log is all read: a newer attempt, or the job's end?
            page = client.read_job_logs(args.parent, args.job_id, rank=args.rank)
            if int(page.get("attempt") or 0) <= (attempt or 0):
                if client.get_job(args.parent, args.job_id).get("state") in TERMINAL:
                    return
                sleep(FOLLOW_POLL_S)
                continue
            complete = False
            if attempt:
                print(f"--- attempt {page.get('attempt')} ---", file=sys.stderr, flush=True)
        else:
            page = client.read_job_logs(args.parent, args.job_id, attempt=attempt,
                                        rank=args.rank, token=token)
        lines = page.get("lines") or []
        if tail is not None:
            tail.extend(lines)
        else:
            for line in lines:
                write(line)
        token = page.get("nextPageToken") or None
        attempt = int(page.get("attempt") or 0) or attempt
        if lines and token:
            continue  # more to read now
        if tail is not None:  # the last N lines so far; a follower goes on from here
            for line in tail:
                write(line)
            tail = None
        if not args.follow or (token is None and args.attempt is not None):
            return
        if token is None:
            complete = True
            continue
        sleep(FOLLOW_POLL_S)


def _print(line: str) -> None:
    print(line, flush=True)


# ---------------------------------------------------------------- mtc tensorboard


def cmd_tensorboard(args: argparse.Namespace, app: EmbeddedApp) -> None:
    """Run TensorBoard on 127.0.0.1 over the job's runs (one per attempt: ``attempt-<n>``),
    or a tuning job's (``trial-<id>/attempt-<n>``), until interrupted."""
    where = _parent(args)
    runs = tensorboard_runs(app, where, args.job_id)
    port = args.port if args.port else free_port()
    command = tensorboard_command(runs, port)
    proc = subprocess.Popen(command)
    signal.signal(signal.SIGTERM, _interrupt)  # a SIGTERM stops TensorBoard too, no orphan
    print(f"TensorBoard for {args.job_id}: http://127.0.0.1:{port}/ "
          f"({len(runs)} log dir{'s' if len(runs) != 1 else ''}; Ctrl-C stops it)", flush=True)
    try:
        proc.wait()
    except KeyboardInterrupt:
        pass
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _parent(args: argparse.Namespace) -> Parent:
    try:
        return parent(args.project or os.environ.get("MTC_PROJECT") or "local",
                      args.location or os.environ.get("MTC_LOCATION") or "local")
    except ApiError as exc:
        raise ClientError.from_status(exc.status_json(), exc.status) from exc


def tensorboard_runs(app: EmbeddedApp, where: Parent, resource_id: str) -> dict[str, Path]:
    """The event directories to show: ``{name: dir}``. A CustomJob id gives one directory
    (its attempts are its runs); a HyperparameterTuningJob id gives one per trial."""
    from services.api.context import find_record
    from services.api.custom_jobs import domain_job_id, job_of
    from services.cli.client import LocalClient

    client = LocalClient(app)
    with app.transaction() as uow:
        known = find_record(uow, "customJob", resource_id, where)
    if known is not None:
        return {"": _event_dir(app, job_of(known))}
    try:  # HyperparameterTuningJobs: their trials are CustomJobs
        tuning_jobs: Any = importlib.import_module("services.api.tuning_jobs")
    except ImportError:  # pragma: no cover - a tree without tuning jobs
        tuning_jobs = None
    if tuning_jobs is not None:
        try:
            study = client._call(lambda: tuning_jobs.get(client.ctx, where, resource_id))
        except ClientError as exc:
            if exc.status != "NOT_FOUND":
                raise
        else:
            trials = {f"trial-{t['id']}": t["customJob"].rsplit("/", 1)[-1]
                      for t in study.get("trials", [])}
            if not trials:
                raise ClientError("FAILED_PRECONDITION", f"{study['name']} has no trials yet")
            return {name: _event_dir(app, domain_job_id(job)) for name, job in trials.items()}
    raise ClientError("NOT_FOUND", f"{where.name}/customJobs/{resource_id} not found (nor a "
                      "hyperparameterTuningJob of that id)")


def _event_dir(app: EmbeddedApp, domain_id: str) -> Path:
    with app.transaction() as uow:
        job = uow.jobs.get(domain_id)
    if job is None:
        raise ClientError("NOT_FOUND", f"job {domain_id} not found")
    return Path(output_dirs(job, app.deps)[2])


def tensorboard_command(runs: dict[str, Path], port: int) -> list[str]:
    exe = shutil.which("tensorboard") or str(Path(sys.executable).with_name("tensorboard"))
    if not Path(exe).exists():
        raise ClientError("FAILED_PRECONDITION", "TensorBoard is not installed here "
                          "(pip install tensorboard)")
    common = ["--host", "127.0.0.1", "--port", str(port), "--reload_interval", "2"]
    if list(runs) == [""]:
        return [exe, "--logdir", str(runs[""]), *common]
    for name, path in runs.items():
        if "," in str(path) or ":" in str(path):
            raise ClientError("FAILED_PRECONDITION", f"trial {name}'s event directory {path} "
                              "has a ',' or ':' TensorBoard's --logdir_spec cannot carry")
    spec = ",".join(f"{name}:{path}" for name, path in runs.items())
    return [exe, "--logdir_spec", spec, *common]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
