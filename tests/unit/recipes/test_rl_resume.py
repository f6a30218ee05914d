"""The RL loop heals like the others: a run stopped at a checkpoint mid-way through RL and
resumed from it (the same Checkpointer) ends with weights equal to an uninterrupted run's,
the reference model (KL) and RL's start figure carried in the checkpoint."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow
torch = pytest.importorskip("torch")
pytest.importorskip("transformers.models.llama.modeling_llama")

CONFIG: dict[str, Any] = {
    "task": "rl", "name": "rl", "version": 1,
    "model": {"family": "llama", "hidden_size": 32, "intermediate_size": 64,
              "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
              "head_dim": 16, "max_position_embeddings": 32},
    "data": {"examples": 200, "seq_len": 24},
    "rl": {"kinds": [3], "sft_steps": 3, "group_size": 4, "prompts_per_step": 2,
           "max_new_tokens": 6, "temperature": 1.0, "kl_coef": 0.05, "lr": 0.01,
           "eval_prompts": 8},
    "hyperparameters": {"steps": 4, "batch_size": 4, "lr": 0.01, "warmup": 1, "seed": 3},
    "checkpoint": {"every": 0},
}


def run(config: dict[str, Any], out: Path) -> dict[str, Any]:
    from mtc_program.torch_checkpoint import Preemption
    from mtc_program.torch_runtime import Env
    from services.recipes.programs import rl

    env = Env.read({"AIP_CHECKPOINT_DIR": str(out / "checkpoints"),
                    "AIP_MODEL_DIR": str(out / "model")})
    assert rl.train(config, env, Preemption()) == 0
    return json.loads((out / "model" / "metrics.json").read_text())  # type: ignore[no-any-return]


def weights(model_dir: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(model_dir / "model.safetensors"))


def test_resumed_mid_rl_equals_uninterrupted(tmp_path: Path) -> None:
    whole = run(CONFIG, tmp_path / "whole")
    first = copy.deepcopy(CONFIG)
    first["hyperparameters"]["steps"] = 2  # stops (and saves) at step 3 + 2, inside RL
    run(first, tmp_path / "split")
    assert (tmp_path / "split" / "checkpoints" / "ckpt-00000005" / ".metadata").is_file()
    resumed = run(CONFIG, tmp_path / "split")  # the same directory: resumes at step 5
    assert resumed["steps"] == whole["steps"] == 7
    assert resumed["reward_start"] == whole["reward_start"]
    a, b = weights(tmp_path / "whole" / "model"), weights(tmp_path / "split" / "model")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert resumed["reward_end"] == whole["reward_end"]


class _HoldAt:
    """A control file's monitor stand-in: the hold order comes at the ``at``-th step."""

    def __init__(self, at: int) -> None:
        self.at, self.asked = at, 0

    def take(self) -> Any:
        from mtc_program.inprocess import HOLD, Order

        self.asked += 1
        return Order(1, HOLD) if self.asked >= self.at else None


def test_an_in_process_restart_keeps_the_policy_and_ends_as_uninterrupted(tmp_path: Path
                                                                          ) -> None:
    """``torch_inprocess`` for RL, as for ``lm``: held at step 5 (inside RL) the call saves
    and ends 75; the next call in the same process reuses the same policy, reference and
    optimizer objects, restores step 5 and ends with an uninterrupted run's weights."""
    from mtc_program.torch_checkpoint import Preemption
    from mtc_program.torch_inprocess import Call
    from mtc_program.torch_runtime import Env
    from mtc_program.torch_tiers import OwnCopy
    from services.recipes.programs import rl

    whole = run(CONFIG, tmp_path / "whole")
    out = tmp_path / "held"
    env = Env.read({"AIP_CHECKPOINT_DIR": str(out / "checkpoints"),
                    "AIP_MODEL_DIR": str(out / "model")})
    kept: dict[str, Any] = {}
    own = OwnCopy()
    assert rl.train(CONFIG, env, Preemption(), Call(env, 0, own, _HoldAt(5)), kept) == 75
    assert (out / "checkpoints" / "ckpt-00000005" / ".metadata").is_file()
    setup = kept["setup"]
    objects = (setup.model, setup.reference, setup.optimizer)
    assert rl.train(CONFIG, env, Preemption(), Call(env, 1, own), kept) == 0
    assert kept["setup"] is setup and (setup.model, setup.reference, setup.optimizer) == objects
    resumed = json.loads((out / "model" / "metrics.json").read_text())
    assert resumed["steps"] == whole["steps"] and resumed["reward_end"] == whole["reward_end"]
    a, b = weights(tmp_path / "whole" / "model"), weights(out / "model")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
