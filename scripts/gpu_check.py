"""The checks of ``scripts/gpu_check.sh`` on a machine with NVIDIA GPUs (run it through the
shell script: that one skips where there is no GPU). Each check prints what it saw; the
script exits 1 if any failed, 0 otherwise.

1. probes: ``nvidia-smi -q -x`` through ``shared.probes.nvidia_smi`` (every GPU parsed, its
   conditions), ``dcgmi diag -r 1 -j`` through ``shared.probes.dcgm`` where DCGM is installed;
2. tiers: a model and optimizer on the GPU saved to the memory tier and restored
   (``mtc_program.torch_tiers``), every tensor equal and on cuda again;
3. recipe: the pretrain recipe (size tiny, 30 steps) under ``torch.distributed.run`` on
   cuda, over NCCL on two ranks where there are two GPUs (one rank where there is one);
4. in-process restart: ``examples/torch_inprocess.py`` on cuda, held at a step and restarted
   in its process on a new rendezvous (this script writes the orders a local compute writes),
   restoring from its own memory.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _p in (ROOT, ROOT / "shared" / "sdk"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from mtc_program import inprocess, protocol  # noqa: E402
from mtc_program.inprocess import HOLD, RESTART, Order  # noqa: E402

PYTHONPATH = os.pathsep.join([str(ROOT), str(ROOT / "shared" / "sdk")])


def probes(tmp: Path) -> str:
    from shared.probes import dcgm, nvidia_smi
    from shared.probes.commands import run_command

    out = run_command(["nvidia-smi", "-q", "-x"], 30.0)
    readings = nvidia_smi.parse_nvidia_smi_xml(out.stdout)
    assert readings, "nvidia-smi -q -x: no GPU in its XML"
    for r in readings:
        print(f"  {r.gpu} {r.product_name}: {r.temperature_c} C, volatile dbe {r.volatile_dbe}, "
              f"remap pending {r.remap_pending}, throttle {list(r.active_throttle_reasons)}")
    for c in nvidia_smi.conditions_from_readings(readings, time.time()):
        print(f"  {c.type}: {c.status.value} ({c.reason})")
    if shutil.which("dcgmi") is None:
        return f"{len(readings)} GPU(s) parsed; dcgmi not installed: the DCGM probe not run"
    diag = dcgm.probe(run_command, time.time(), level=1)
    print(f"  {diag.type}: {diag.status.value} ({diag.reason}) {dict(diag.details)}")
    return f"{len(readings)} GPU(s) parsed; dcgmi diag -r 1: {diag.status.value}"


def tiers(tmp: Path) -> str:
    import torch

    from mtc_program.tiers import TierSettings
    from mtc_program.torch_tiers import STATE_KEY, TorchTiers, load_into

    assert torch.cuda.is_available(), "nvidia-smi lists a GPU, torch sees none (a CPU build?)"
    model = torch.nn.Linear(512, 512).cuda()
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(8, 512, device="cuda")).sum().backward()
    opt.step()  # the optimizer's state, on the GPU too
    state = {"model": model, "optim": opt}
    settings = TierSettings(rank=0, world_size=1, durable_dir=tmp / "durable",
                            tier1_dir=tmp / "memory", tier1_every=1, replicated=False)
    writer = TorchTiers(settings)
    writer.after_step(1, state)
    writer.close()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    restored = TorchTiers(settings).restore()
    assert restored is not None and restored.tier == "memory", restored
    load_into(state, bytes(restored.state[STATE_KEY]))
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) and after[k].is_cuda for k in before)
    moments = [s["exp_avg"] for s in opt.state.values()]
    assert moments and all(m.is_cuda for m in moments)
    return f"step {restored.step} restored from {restored.path}, every tensor equal, on cuda"


def recipe(tmp: Path) -> str:
    import torch

    from services.recipes.catalog import program_config, resolve

    config = program_config(resolve("pretrain", ["size=tiny"]))
    config["hyperparameters"]["steps"] = 30
    config["checkpoint"] = {"every": 10}
    ranks = 2 if torch.cuda.device_count() >= 2 else 1
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={ranks}", "-m", "services.recipes.programs.lm",
           "--config", json.dumps(config)]
    env = {**os.environ, "PYTHONPATH": PYTHONPATH, protocol.CHECKPOINT_DIR: str(tmp / "ckpt"),
           protocol.MODEL_DIR: str(tmp / "model")}
    done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=180)
    text = done.stdout + done.stderr
    assert done.returncode == 0, text[-3000:]
    assert "parameters on cuda" in text, text[-3000:]
    metrics = json.loads((tmp / "model" / "metrics.json").read_text())
    group = "NCCL, 2 ranks" if ranks == 2 else "1 rank (one GPU: no NCCL group)"
    return f"30 steps on cuda, {group}: final loss {metrics['final_loss']:.3f}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def restart(tmp: Path) -> str:
    import torch

    ranks = 2 if torch.cuda.device_count() >= 2 else 1
    ports = free_port(), free_port()
    controls = [tmp / f"ctl{r}" / "restart.json" for r in range(ranks)]
    log, after = tmp / "attempt1.log", tmp / "attempt2.log"

    def env(rank: int, attempt: int, port: int) -> dict[str, str]:
        return {"RANK": str(rank), "WORLD_SIZE": str(ranks), "LOCAL_RANK": str(rank),
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                protocol.CHECKPOINT_DIR: str(tmp / "ckpt"), protocol.JOB_ATTEMPT: str(attempt),
                protocol.TIER1_DIR: str(tmp / f"mem{rank}"), protocol.TIER1_EVERY: "5",
                protocol.RESTART_FILE: str(controls[rank]), "PYTHONPATH": PYTHONPATH}

    with log.open("ab") as out:
        procs = [subprocess.Popen(
            [sys.executable, str(ROOT / "examples" / "torch_inprocess.py"), "--steps", "60",
             "--step-time", "0.05"], env={**os.environ, **env(r, 1, ports[0])}, stdout=out,
            stderr=subprocess.STDOUT) for r in range(ranks)]
    try:
        def until(ok: Callable[[], bool], what: str) -> None:
            deadline = time.monotonic() + 90
            while not ok():
                assert all(p.poll() is None for p in procs), (what, log.read_text()[-3000:])
                assert time.monotonic() < deadline, (what, log.read_text()[-3000:])
                time.sleep(0.05)

        until(lambda: all(len(list((tmp / f"mem{r}").glob("step-*"))) >= 2
                          for r in range(ranks)), "two memory saves per rank")
        for c in controls:
            inprocess.atomic_write(c, Order(10, HOLD, deadline=time.time() + 60).to_json())
        until(lambda: all(inprocess.read_state(c).get("held") == 10 for c in controls),
              "the holds answered")
        for r, c in enumerate(controls):
            inprocess.atomic_write(c, Order(11, RESTART, env(r, 2, ports[1]),
                                            str(after)).to_json())
        codes = [p.wait(120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    text = after.read_text() if after.exists() else log.read_text()
    assert codes == [0] * ranks, text[-3000:]
    assert text.count("from this process's memory (no tier read)") == ranks, text[-3000:]
    assert f"on port {ports[1]}" in text and "done at step 60" in text, text[-3000:]
    return f"{ranks} rank(s) held, restarted in their processes, restored from memory"


CHECKS: list[tuple[str, Callable[[Path], str]]] = [
    ("probes", probes), ("tiers", tiers), ("recipe", recipe), ("in-process restart", restart)]


def main() -> int:
    failed = []
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="mtc-gpu-check-") as tmp:
        for name, check in CHECKS:
            where = Path(tmp) / name.replace(" ", "-")
            where.mkdir()
            started = time.monotonic()
            print(f"== {name}", flush=True)
            try:
                said = check(where)
            except Exception:
                failed.append(name)
                print(f"FAIL {name} ({time.monotonic() - started:.1f}s)\n{traceback.format_exc()}",
                      flush=True)
                continue
            print(f"ok   {name} ({time.monotonic() - started:.1f}s): {said}", flush=True)
    total = time.monotonic() - began
    print(f"gpu check: {len(CHECKS) - len(failed)}/{len(CHECKS)} passed in {total:.0f}s"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
