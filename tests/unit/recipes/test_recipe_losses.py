"""Each recipe, at its tiny size, trains in process (the real program, real torch, no
download) to a final loss inside the range its file names; continued pretraining starts from
the pretrain run's saved model and starts lower than from scratch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from services.recipes.catalog import Recipe, program_config, resolve

pytestmark = pytest.mark.slow
torch = pytest.importorskip("torch")
pytest.importorskip("transformers.models.llama.modeling_llama")


def train(recipe: Recipe, out: Path) -> dict[str, Any]:
    from mtc_program.torch_checkpoint import Preemption
    from mtc_program.torch_runtime import Env
    from services.recipes.programs import lm, rl

    env = Env.read({"AIP_CHECKPOINT_DIR": str(out / "checkpoints"),
                    "AIP_MODEL_DIR": str(out / "model")})
    loop = rl.train if recipe.body["task"] == "rl" else lm.train
    assert loop(program_config(recipe), env, Preemption()) == 0
    return json.loads((out / "model" / "metrics.json").read_text())  # type: ignore[no-any-return]


def test_pretrain_llama_then_continued_pretraining_land_in_their_ranges(tmp_path: Path) -> None:
    pretrain = resolve("pretrain", ["size=tiny"])
    first = train(pretrain, tmp_path / "pretrain")
    assert pretrain.within(first["final_loss"]), (first, pretrain.expected_loss)
    assert first["steps"] == pretrain.body["hyperparameters"]["steps"]
    checkpoint = tmp_path / "pretrain" / "checkpoints" / "ckpt-00000060"
    assert (checkpoint / ".metadata").is_file()

    # a durable checkpoint is a starting point too: the same weights as the saved model
    from services.recipes.programs.lm import build_model

    from_checkpoint = build_model({"family": "gemma"}, init_from=str(checkpoint))
    from_model = build_model({}, init_from=str(tmp_path / "pretrain" / "model"))
    saved, loaded = from_model.state_dict(), from_checkpoint.state_dict()
    assert saved.keys() == loaded.keys()
    assert all(torch.equal(saved[k], loaded[k]) for k in saved)

    continued = resolve("continued-pretraining",
                        ["size=tiny", f"init_from={tmp_path / 'pretrain' / 'model'}"])
    second = train(continued, tmp_path / "continued")
    assert continued.within(second["final_loss"]), (second, continued.expected_loss)


def test_pretrain_gemma_lands_in_its_range(tmp_path: Path) -> None:
    recipe = resolve("pretrain", ["size=tiny", "model.family=gemma"])
    metrics = train(recipe, tmp_path)
    assert recipe.within(metrics["final_loss"]), (metrics, recipe.expected_loss)
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    assert config["model_type"] == "gemma"


def test_sft_loss_on_the_answers_lands_in_its_range(tmp_path: Path) -> None:
    recipe = resolve("sft", ["size=tiny"])
    metrics = train(recipe, tmp_path)
    assert recipe.within(metrics["final_loss"]), (metrics, recipe.expected_loss)


def test_rl_raises_the_reward_over_its_start(tmp_path: Path) -> None:
    """GRPO from a model SFT-trained in the same run: the held-out mean reward (the same
    sampled draws at RL's start and end) ends above the start by the recipe's margin."""
    recipe = resolve("rl", ["size=tiny"])
    metrics = train(recipe, tmp_path)
    assert recipe.reward_within(metrics["reward_start"], metrics["reward_end"]), (
        metrics, recipe.expected_reward)
    rl = recipe.body["rl"]
    assert metrics["steps"] == rl["sft_steps"] + recipe.body["hyperparameters"]["steps"]
    assert (tmp_path / "model" / "model.safetensors").is_file()
