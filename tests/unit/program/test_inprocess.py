"""The program side of the in-process restart (``mtc_program.inprocess``): its poll sees
each new order once, ignores stale and torn ones, holds until a restart or a deadline, and
applies the new attempt's environment and log."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from mtc_program import inprocess
from mtc_program.inprocess import HOLD, RESTART, InProcessRestart, Order


def write(control: Path, order: Order) -> None:
    inprocess.atomic_write(control, order.to_json())


def test_poll_returns_each_newer_order_once_and_skips_stale_and_torn(tmp_path: Path) -> None:
    control = tmp_path / "ctl.json"
    write(control, Order(3, HOLD))  # an order older than the process: not for it
    r = InProcessRestart(control)
    assert r.poll() is None
    r.declare()
    assert inprocess.read_state(control) == {"pid": os.getpid(), "held": 0, "applied": 3}
    write(control, Order(4, HOLD, deadline=time.time() + 60))
    got = r.poll()
    assert got is not None and (got.generation, got.action) == (4, HOLD)
    r.held(got)
    assert inprocess.read_state(control)["held"] == 4
    assert r.poll() is None  # unchanged file: nothing new
    control.write_bytes(b'{"generation": 5, "act')  # torn: not an order, read again later
    assert r.poll() is None
    write(control, Order(4, RESTART))  # not newer than what it acted on
    assert r.poll() is None
    write(control, Order(5, RESTART, {"RANK": "2"}))
    got = r.poll()
    assert got is not None and got.env == {"RANK": "2"}


def test_wait_returns_the_restart_or_none_on_stop_or_deadline(tmp_path: Path) -> None:
    control = tmp_path / "ctl.json"
    r = InProcessRestart(control)
    hold = Order(1, HOLD, deadline=time.time() + 0.2)
    write(control, hold)
    assert r.poll() == hold
    r.held(hold)
    began = time.monotonic()
    assert r.wait(hold, lambda: False) is None  # nobody took it: its deadline ends the hold
    assert 0.1 < time.monotonic() - began < 5
    assert r.wait(Order(1, HOLD), lambda: True) is None  # a SIGTERM while held
    write(control, Order(2, RESTART, {"MTC_JOB_ATTEMPT": "7"}))
    got = r.wait(Order(1, HOLD), lambda: False)
    assert got is not None and got.action == RESTART and got.generation == 2


def test_apply_takes_the_new_environment_and_log(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    control = tmp_path / "ctl.json"
    monkeypatch.setenv("MTC_JOB_ATTEMPT", "1")
    monkeypatch.setenv("RANK", "0")  # so that what apply() sets is undone after the test
    r = InProcessRestart(control)
    log = tmp_path / "attempt-2.log"
    saved = os.dup(1), os.dup(2)
    try:
        r.apply(Order(2, RESTART, {"MTC_JOB_ATTEMPT": "2", "RANK": "1"}, str(log)))
        os.write(1, b"after the restart\n")
        os.write(2, b"to stderr\n")
    finally:
        sys.stdout.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])
    assert os.environ["MTC_JOB_ATTEMPT"] == "2" and os.environ["RANK"] == "1"
    assert log.read_text() == "after the restart\nto stderr\n"
    assert inprocess.read_state(control) == {"pid": os.getpid(), "held": 0, "applied": 2}


def test_without_the_variable_there_is_no_in_process_restart() -> None:
    assert InProcessRestart.from_env({}) is None
    assert InProcessRestart.from_env({inprocess.RESTART_FILE: "/x/ctl"}) is not None
    assert Order.parse(b'{"generation": 1, "action": "explode"}') is None
