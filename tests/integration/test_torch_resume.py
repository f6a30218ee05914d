"""Bit-exact resume of a real torch.distributed program (services/recipes/programs/lm.py, a
tiny Llama with attention dropout, DDP over gloo, 2 ranks forked by the test with the
variables torchrun would set): a run
stopped mid-way by SIGTERM to one rank and resumed from its torch.distributed.checkpoint ends
with weights equal (torch.equal) to an uninterrupted run's, and its TensorBoard curve holds
every step exactly once across the two attempts."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import socket
import struct
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

torch = pytest.importorskip("torch")
pytest.importorskip("transformers.models.llama.modeling_llama")

STEPS, EVERY = 12, 3
CONFIG: dict[str, Any] = {
    "task": "pretrain",
    "model": {"family": "llama", "hidden_size": 32, "intermediate_size": 64,
              "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
              "max_position_embeddings": 64, "attention_dropout": 0.1},
    "data": {"seq_len": 32, "corpus_bytes": 60_000},
    "hyperparameters": {"steps": STEPS, "batch_size": 4, "lr": 0.003, "warmup": 2},
    "checkpoint": {"every": EVERY},
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Rank:
    """A rank forked from this process (torch and transformers already imported: no seconds
    of import per rank), exiting with the program's code; its output goes to a file."""

    def __init__(self, env: dict[str, str], config: dict[str, Any], log: Path) -> None:
        self.log, self.env = log, env
        self.proc = multiprocessing.get_context("fork").Process(
            target=_rank_main, args=(env, config, str(log)), daemon=True)
        self.proc.start()

    def poll(self) -> int | None:
        return self.proc.exitcode

    def send_signal(self, signum: int) -> None:
        assert self.proc.pid is not None
        os.kill(self.proc.pid, signum)


def _rank_main(env: dict[str, str], config: dict[str, Any], log: str) -> None:
    from services.recipes.programs import lm

    os.environ.update(env)
    with open(log, "w", buffering=1) as out:
        sys.stdout = sys.stderr = out
        try:
            code = lm.main(["--config", json.dumps(config)])
        except BaseException:
            traceback.print_exc()
            code = 1
        out.flush()
    os._exit(code)


def launch(out: Path, attempt: int, config: dict[str, Any],
           tiers: dict[str, str] | None = None, controls: list[Path] | None = None
           ) -> list[Rank]:
    """Two ranks with the variables torchrun (and mtc's managed_env) sets; ``tiers``: the
    checkpoint tiers' variables too (two simulated nodes under ``out/mem``, as
    ``protocol.tier_env`` lays them out: rank r's peer copy on node (r + 1) % 2)."""
    port = free_port()
    out.mkdir(parents=True, exist_ok=True)
    ranks = []
    for rank in range(2):
        env = {"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
               "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "AIP_CHECKPOINT_DIR": str(out / "checkpoints"), "AIP_MODEL_DIR": str(out / "model"),
               "AIP_TENSORBOARD_LOG_DIR": str(out / "tb"), "MTC_JOB_ATTEMPT": str(attempt)}
        if tiers is not None:
            buddy = out / "mem" / f"node-{(rank + 1) % 2}" / "peer" / f"rank-{rank}"
            env |= {"MTC_TIER1_DIR": str(out / "mem" / f"node-{rank}" / f"rank-{rank}"),
                    "MTC_TIER2_DIR": str(buddy), "MTC_TIER2_SOURCE_DIR": str(buddy),
                    "MTC_PROGRESS_FILE": str(out / "progress" / f"rank-{rank}.json"),
                    **tiers}
        if controls is not None:  # in-process restart offered, as the local compute does
            env["MTC_RESTART_FILE"] = str(controls[rank])
        ranks.append(Rank(env, config, out / f"attempt-{attempt}-rank-{rank}.log"))
    return ranks


def finish(ranks: list[Rank], timeout: float = 120) -> tuple[list[int | None], str]:
    for r in ranks:
        r.proc.join(timeout)
    return [r.poll() for r in ranks], "\n".join(r.log.read_text() for r in ranks)


def weights(model_dir: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(model_dir / "model.safetensors"))


def scalar_steps(tb: Path) -> list[int]:
    from tensorboardX.proto.event_pb2 import Event

    steps = []
    for path in sorted(tb.glob("attempt-*/events.out.tfevents.*")):
        data, pos = path.read_bytes(), 0
        while pos + 12 <= len(data):
            (length,) = struct.unpack_from("<Q", data, pos)
            event = Event()
            event.ParseFromString(data[pos + 12 : pos + 12 + length])
            steps += [event.step for v in event.summary.value if v.tag == "loss"]
            pos += 16 + length
    return sorted(steps)


def test_resume_after_sigterm_is_bit_exact(tmp_path: Path) -> None:
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    slow = {**CONFIG, "hyperparameters": {**CONFIG["hyperparameters"], "step_sleep_s": 0.3}}
    uninterrupted = launch(whole, 1, CONFIG)
    first = launch(cut, 1, slow)  # same math, slower steps: time to stop it mid-way
    marker = cut / "checkpoints" / f"ckpt-{EVERY:08d}" / ".metadata"
    deadline = time.monotonic() + 120
    while not marker.exists() and time.monotonic() < deadline:
        assert first[1].poll() is None, finish(first)[1]
        time.sleep(0.05)
    assert marker.exists(), "no first checkpoint"
    first[1].send_signal(signal.SIGTERM)  # one rank only: the ranks agree on the stop step
    codes, log = finish(first)
    assert codes == [75, 75], log
    saved = sorted(int(p.name[5:]) for p in (cut / "checkpoints").glob("ckpt-*[0-9]"))
    assert EVERY <= saved[-1] < STEPS, saved
    codes, whole_log = finish(uninterrupted)
    assert codes == [0, 0], whole_log

    codes, log = finish(launch(cut, 2, CONFIG))
    assert codes == [0, 0], log
    assert f"resumed at step {saved[-1]}" in log
    a, b = weights(whole / "model"), weights(cut / "model")
    assert a.keys() == b.keys()
    unequal = [k for k in a if not torch.equal(a[k], b[k])]
    assert not unequal, unequal
    loss = [json.loads((d / "model" / "metrics.json").read_text())["final_loss"]
            for d in (whole, cut)]
    assert loss[0] == loss[1]
    assert scalar_steps(cut / "tb") == list(range(1, STEPS + 1))


TIERED = {"MTC_TIER1_EVERY": "2", "MTC_PROGRESS_INTERVAL_S": "0"}


def newest_entry(directory: Path) -> int:
    """The newest step whose tier entry is complete (its manifest is written last)."""
    return max((int(p.parent.name.split("-")[-1]) for p in directory.glob("step-*/manifest.json")),
               default=0)


@pytest.mark.parametrize("node_lost", [False, True], ids=["memory", "peer"])
def test_resume_from_a_near_tier_after_sigkill_is_bit_exact(tmp_path: Path,
                                                            node_lost: bool) -> None:
    """Both ranks SIGKILLed (no checkpoint on the way out) past a memory save and before the
    next durable one: the next attempt restores the memory tier (``peer``: node 1's memory is
    wiped first, as a lost node's is, so rank 1 restores its copy from node 0) and ends with
    the uninterrupted run's weights; the heartbeat says each rank's step."""
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    config = {**CONFIG, "checkpoint": {"every": 6}}
    slow = {**config, "hyperparameters": {**config["hyperparameters"], "step_sleep_s": 0.3}}
    uninterrupted = launch(whole, 1, config)
    first = launch(cut, 1, slow, TIERED)
    mem = [cut / "mem" / f"node-{r}" / f"rank-{r}" for r in range(2)]
    deadline = time.monotonic() + 120
    while min(newest_entry(m) for m in mem) < 4 and time.monotonic() < deadline:
        assert all(r.poll() is None for r in first), finish(first)[1]
        time.sleep(0.05)
    for r in first:
        r.send_signal(signal.SIGKILL)
    codes, log = finish(first)
    assert codes == [-9, -9], log
    durable = sorted(int(p.name[5:]) for p in (cut / "checkpoints").glob("ckpt-*[0-9]"))
    near = min(newest_entry(m) for m in mem)
    assert near > max(durable, default=0), (near, durable)  # the near tier is the newer one
    beat = json.loads((cut / "progress" / "rank-0.json").read_text())
    # the heartbeat follows the writer thread: it may trail the newest entry by one save
    assert beat["step"] >= near and beat["newest"]["memory"] >= near - 2, beat
    expected = near
    if node_lost:
        import shutil

        shutil.rmtree(cut / "mem" / "node-1")  # rank 1's memory and rank 0's peer copy
        # rank 1 has what its buddy's node holds (the writer puts the peer copy after memory)
        expected = min(near, newest_entry(cut / "mem" / "node-0" / "peer" / "rank-1"))
        assert expected > 0
    codes, whole_log = finish(uninterrupted)
    assert codes == [0, 0], whole_log

    codes, log = finish(launch(cut, 2, config, TIERED))
    assert codes == [0, 0], log
    tier = "peer" if node_lost else "memory"
    assert f"[lm rank 1/2] restoring step {expected} from the {tier} tier" in log, log
    a, b = weights(whole / "model"), weights(cut / "model")
    unequal = [k for k in a if not torch.equal(a[k], b[k])]
    assert not unequal, unequal
    assert scalar_steps(cut / "tb") == list(range(1, STEPS + 1))


def test_a_hold_restarts_the_recipe_in_process_and_a_standby_takes_a_rank(tmp_path: Path) -> None:
    """The recipes' program under ``torch_inprocess``: both ranks held alive (as for a hot
    swap), they stop at one step and save; rank 0 goes on in its process on the next
    attempt's port, restoring from its own memory, rank 1 is given to a warm standby (its
    model built before it had a rank) and the held rank 1 ends on SIGTERM. The weights equal
    an uninterrupted run's."""
    from mtc_program import inprocess
    from mtc_program.inprocess import HOLD, RESTART, Order

    whole, cut = tmp_path / "whole", tmp_path / "cut"
    uninterrupted = launch(whole, 1, CONFIG)
    slow = {**CONFIG, "hyperparameters": {**CONFIG["hyperparameters"], "step_sleep_s": 0.3}}
    controls = [cut / f"ctl-{r}" / "restart.json" for r in (0, 1)]
    standby_ctl = cut / "ctl-standby" / "restart.json"
    inprocess.atomic_write(standby_ctl, Order(1, HOLD, deadline=time.time() + 120).to_json())
    with_ctl = {**TIERED, "MTC_TIER1_EVERY": "3"}
    first = launch(cut, 1, slow, with_ctl, controls=controls)
    standby_env = {**first[1].env, "MTC_RESTART_FILE": str(standby_ctl), "MTC_STANDBY": "1"}
    standby = Rank(standby_env, CONFIG, cut / "standby.log")
    mem = [cut / "mem" / f"node-{r}" / f"rank-{r}" for r in range(2)]
    deadline = time.monotonic() + 120
    while not (min(newest_entry(m) for m in mem) >= 3 and "standby ready" in
               (standby.log.read_text() if standby.log.exists() else "")):
        assert all(r.poll() is None for r in [*first, standby]), finish(first)[1]
        assert time.monotonic() < deadline, finish(first)[1]
        time.sleep(0.05)
    for c in controls:
        inprocess.atomic_write(c, Order(5, HOLD, deadline=time.time() + 60).to_json())
    while not all(inprocess.read_state(c).get("held") == 5 for c in controls):
        assert all(r.poll() is None for r in first) and time.monotonic() < deadline, \
            finish(first)[1]
        time.sleep(0.05)
    port = free_port()
    for rank, control in ((0, controls[0]), (1, standby_ctl)):
        env = {**first[rank].env, "MTC_JOB_ATTEMPT": "2", "MASTER_PORT": str(port),
               "MTC_RESTART_FILE": str(control)}
        inprocess.atomic_write(control, Order(6, RESTART, env, str(cut / f"a2-{rank}.log")).to_json())
    first[1].send_signal(signal.SIGTERM)  # the held rank nobody took
    codes, log = finish([first[0], standby, first[1]])
    log += "".join(p.read_text() for p in cut.glob("a2-*.log"))
    assert codes == [0, 0, 75], log
    assert "[lm rank 0/2] restore: step" in log and "from this process's memory" in log, log
    assert "(in-process restart 1)" in log, log
    codes, whole_log = finish(uninterrupted)
    assert codes == [0, 0], whole_log
    a, b = weights(whole / "model"), weights(cut / "model")
    unequal = [k for k in a if not torch.equal(a[k], b[k])]
    assert not unequal, unequal
