"""The adapters' side of in-process restart, whatever runs the ranks: the orders written to a
rank's control file and the answers read back (the program's side: ``mtc_program.inprocess``).

Pure file operations on the control file, so every compute that offers warm processes (the
local one, Slurm's) holds, restarts and ends a declared rank the same way; what each adapter
keeps about the processes (which rank, which node, until when) is its own.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path

from mtc_program import inprocess
from mtc_program.inprocess import HOLD, RESTART, Order

RESTART_FILE = inprocess.RESTART_FILE  # the managed environment's name for the control file
PARK_S = 20.0  # how long a held process waits for the next attempt before it is ended
IN_PROCESS_MODES = frozenset({"in_place", "hot_swap", "scale_down"})


def next_generation(control: Path, state: Mapping[str, int] | None = None) -> int:
    """The generation of the next order to ``control``: above every order written and every
    answer given (``state``: the program's answers, read here when not given)."""
    order = inprocess.read_order(control)
    state = inprocess.read_state(control) if state is None else state
    return max(order.generation if order else 0, state.get("applied", 0),
               state.get("held", 0)) + 1


def declared(control: Path) -> bool:
    """The program behind ``control`` declared in-process restart (its answers name its pid)."""
    return "pid" in inprocess.read_state(control)


def write_hold(control: Path, deadline: float) -> int:
    """Order a hold that lasts until ``deadline`` (wall time); its generation. A hold whose
    deadline is now ends a held program (it exits as on SIGTERM): the way to end a process
    the adapter cannot signal."""
    gen = next_generation(control)
    inprocess.atomic_write(control, Order(gen, HOLD, deadline=deadline).to_json())
    return gen


def held_since(control: Path, generation: int) -> bool:
    """The program answered the hold of ``generation`` (its save is complete)."""
    return inprocess.read_state(control).get("held", 0) >= generation


def write_restart(control: Path, env: Mapping[str, str], log_path: str) -> int:
    """Order the program to go on as a rank of the next attempt; its generation."""
    gen = next_generation(control)
    inprocess.atomic_write(control, Order(gen, RESTART, dict(env), log_path).to_json())
    return gen


def hold_deadline(park_s: float) -> float:
    return time.time() + park_s  # the program reads it: wall time
