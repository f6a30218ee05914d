"""A Slurm task that hands its rank to a held process of the job on its node (warm attempts).

``task.sh`` of an in-place, hot-swap or scale-down attempt runs this, instead of a new
launcher, for a rank the adapter gave a parked process (``rank-<RANK>.take``: the process's
control file and the exit file its launcher writes). The task has computed the rank's
environment exactly as for a new process (``task.sh``); this writes it to the held program
as a ``restart`` order (``mtc_program.inprocess``), waits for the program to take it, then
for the process to end, and leaves its code in this attempt's exit file, so the attempt
reads every rank's code from its own run directory as it does for a launched rank. Its
output stays where the process wrote it (the job's Slurm output).

If the program never takes the order (it ended, or its hold ran out) the rank exits 137,
a process that is gone, and the attempt fails as it would had the rank died.

Standard library only, run as ``python -I handover.py`` (like ``worker_launcher``): the
order's JSON is ``mtc_program.inprocess.Order``'s, restated (a unit test keeps them equal).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import tempfile
import time

TAKE_S = 10.0  # how long a held program may take to pick up its restart order
GONE = 137
KEEP = ("MTC_RESTART_FILE",)  # the process keeps its own control file


def read_json(path: str) -> dict[str, object]:
    try:
        with open(path, "rb") as f:
            d = json.load(f)
    except (OSError, ValueError):
        return {}
    return d if isinstance(d, dict) else {}


def generation(control: str) -> int:
    order, state = read_json(control), read_json(control + ".state")
    gens = [v for v in (order.get("generation"), state.get("applied"), state.get("held"))
            if isinstance(v, int)]
    return max(gens, default=0) + 1


def write_atomic(path: str, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".restart.", dir=os.path.dirname(path))
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def restart_order(gen: int, env: dict[str, str]) -> bytes:
    return json.dumps({"generation": gen, "action": "restart", "env": env, "log_path": "",
                       "deadline": None}).encode()


def read_env(path: str) -> dict[str, str]:
    with open(path, "rb") as f:
        raw = f.read()
    out: dict[str, str] = {}
    for item in raw.split(b"\0"):
        name, sep, value = item.decode(errors="replace").partition("=")
        if sep and name not in KEEP:
            out[name] = value
    return out


def read_code(path: str) -> int | None:
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def write_code(path: str, code: int) -> None:
    write_atomic(path, f"{code}\n".encode())


def hand_over(take: str, env_file: str, exit_file: str, interval_s: float = 0.05) -> int:
    held = read_json(take)
    control, launcher_exit = str(held.get("control", "")), str(held.get("exit_file", ""))
    if not control or not launcher_exit or read_code(launcher_exit) is not None:
        write_code(exit_file, GONE)
        return GONE
    gen = generation(control)
    write_atomic(control, restart_order(gen, read_env(env_file)))
    deadline = time.monotonic() + TAKE_S
    while read_json(control + ".state").get("applied", 0) != gen:
        code = read_code(launcher_exit)
        if read_json(control + ".state").get("applied", 0) == gen:
            break  # taken, and perhaps over already: its code is the rank's
        if code is not None or time.monotonic() > deadline:
            write_code(exit_file, GONE)
            return GONE
        time.sleep(interval_s)
    print(f"[mtc] rank {os.environ.get('RANK', '?')}: went on in its process"
          f" (pid {read_json(control + '.state').get('pid')})", flush=True)
    while (code := read_code(launcher_exit)) is None:
        time.sleep(interval_s * 4)
    write_code(exit_file, code)
    return code


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--take", required=True)
    ap.add_argument("--env-file", required=True)
    ap.add_argument("--exit-file", required=True)
    args = ap.parse_args(argv)
    # a stop (the attempt's SIGTERM) reaches the held process itself: wait for its code
    with contextlib.suppress(ValueError):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return hand_over(args.take, args.env_file, args.exit_file)


if __name__ == "__main__":
    sys.exit(main())
