"""Recipe files: versioned, resolvable with sizes and --set overrides, bad input named, and
turned into a CustomJob in Vertex's layout (pool 0 one replica, the rest in pool 1)."""

from __future__ import annotations

import json

import pytest

from services.recipes.catalog import custom_job, names, program_config, raw, resolve
from services.recipes.programs.lm_data import encode_example, sft_examples
from shared.domain.errors import NotFound, ValidationError


def test_every_recipe_is_versioned_and_resolves_at_each_size() -> None:
    assert {"pretrain", "sft", "continued-pretraining", "rl"} <= set(names())
    for name in names():
        body = raw(name)
        assert isinstance(body["version"], int)
        for size in [None, *body.get("sizes", {})]:
            recipe = resolve(name, [f"size={size}"] if size else [])
            if recipe.body["task"] == "rl":
                floor, gain = recipe.expected_reward
                assert 0 <= floor <= 1 and gain > 0
                continue
            low, high = recipe.expected_loss
            assert 0 <= low < high


def test_overrides_and_sizes_apply_in_order() -> None:
    recipe = resolve("pretrain", ["size=tiny", "hyperparameters.steps=7", "model.family=gemma"])
    assert recipe.body["hyperparameters"]["steps"] == 7
    assert recipe.body["model"]["family"] == "gemma"
    assert recipe.body["model"]["hidden_size"] == 32  # from the tiny size
    assert "sizes" not in recipe.body


@pytest.mark.parametrize(("sets", "field"), [
    (["hyperparameters.steps=0"], "hyperparameters.steps"),
    (["model.family=gpt"], "model.family"),
    (["size=huge"], "size"),
    (["nonsense=1"], "--set"),
    (["steps"], "--set"),
    (["parallelism.replicas=0"], "parallelism.replicas"),
])
def test_bad_overrides_name_the_field(sets: list[str], field: str) -> None:
    with pytest.raises(ValidationError) as err:
        resolve("pretrain", sets)
    assert err.value.path == field


@pytest.mark.parametrize(("sets", "field"), [
    (["rl.group_size=1"], "rl.group_size"),
    (["rl.kinds=[7]"], "rl.kinds"),
    (["rl.lr=0"], "rl.lr"),
    (["rl.temperature=-1"], "rl.temperature"),
    (["expected_reward.min=x"], "expected_reward"),
])
def test_bad_rl_settings_name_the_field(sets: list[str], field: str) -> None:
    with pytest.raises(ValidationError) as err:
        resolve("rl", ["size=tiny", *sets])
    assert err.value.path == field


def test_the_rl_reward_needs_the_floor_and_the_gain() -> None:
    recipe = resolve("rl", ["expected_reward.min=0.3", "expected_reward.min_gain=0.1"])
    assert recipe.reward_within(0.2, 0.31)
    assert not recipe.reward_within(0.25, 0.31)  # above the floor, too little gain
    assert not recipe.reward_within(0.0, 0.29)   # enough gain, under the floor
    body = custom_job(resolve("rl", ["size=tiny"]), python="python3")
    container = body["jobSpec"]["workerPoolSpecs"][0]["containerSpec"]
    assert container["command"][1:] == ["-m", "services.recipes.programs.rl"]
    assert json.loads(container["args"][1])["rl"]["kinds"] == [3]


def test_an_unknown_recipe_is_not_found() -> None:
    with pytest.raises(NotFound):
        resolve("nope")


def test_the_custom_job_has_vertex_layout_and_the_recipe_config() -> None:
    recipe = resolve("pretrain", ["parallelism.replicas=3"])
    body = custom_job(recipe, python="/usr/bin/python3", cluster="c1")
    pools = body["jobSpec"]["workerPoolSpecs"]
    assert [p["replicaCount"] for p in pools] == [1, 2]
    assert body["jobSpec"]["persistentResourceId"] == "c1"
    assert body["labels"] == {"mtc-recipe": "pretrain", "mtc-recipe-version": "1"}
    container = pools[0]["containerSpec"]
    assert container["command"] == ["/usr/bin/python3", "-m", "services.recipes.programs.lm"]
    assert json.loads(container["args"][1]) == json.loads(json.dumps(program_config(recipe)))
    single = custom_job(resolve("pretrain", ["size=tiny"]), python="python3")
    assert len(single["jobSpec"]["workerPoolSpecs"]) == 1


def test_sft_labels_cover_the_answer_only() -> None:
    prompt, answer = sft_examples(1, seed=3)[0]
    ids, labels = encode_example(prompt, answer, seq_len=32)
    kept = [t for t in labels if t != -100]
    assert bytes(t for t in kept if t < 256).decode() == answer
    assert len(kept) == len(answer) + 1  # and the end-of-sequence token
    assert len(ids) == len(labels) == 32
