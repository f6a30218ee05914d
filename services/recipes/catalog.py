"""Recipes: versioned YAML files of data (``services/recipes/data/*.yaml``) that become an
ordinary CustomJob, so the API, the SDK, the console and healing see nothing special.

A recipe holds ``version``, ``name``, ``task``, ``model`` (the architecture's config fields and
``family``), ``data``, ``parallelism`` (``replicas`` and the machine), ``hyperparameters``,
``checkpoint`` (``every``: durable; ``memory_every``: the memory and peer tiers),
``expected_loss`` (``min``/``max`` of the final loss; the RL recipe has ``rl``, its GRPO
settings, and ``expected_reward`` instead: ``min`` of the end's reward and ``min_gain`` over
RL's start) and
``sizes`` (named overrides: ``tiny`` is what the tests run). ``resolve`` applies a size and
``--set key.path=value`` overrides (values parsed as YAML scalars) and checks the result;
``custom_job`` turns it into a CustomJob body in Vertex's layout (workerPoolSpecs[0] one
replica, the other ranks in pool 1) running ``python -m services.recipes.programs.lm --config
<json>`` (``.rl`` for the RL recipe): the workloads beside this file, which use the in-job SDK.
``program_pythonpath`` is where the job imports both from.
Pure data in, data out: no torch here (the CLI imports it).
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import mtc_program
from shared import yaml_text
from shared.domain.errors import NotFound, ValidationError

PROGRAM = "services.recipes.programs.lm"
PROGRAMS = {"rl": "services.recipes.programs.rl"}  # a task with a loop of its own; the rest run PROGRAM
TASKS = ("pretrain", "sft", "rl")
FAMILIES = ("llama", "gemma")
SECTIONS = ("model", "data", "parallelism", "hyperparameters", "checkpoint", "expected_loss",
            "rl", "expected_reward")
# keys `--set` may name at the top (the rest live in the sections)
TOP_KEYS = ("init_from", "parent_model", "size", "image", "python", "task")



def program_pythonpath() -> str:
    """The job's ``PYTHONPATH`` for the recipes' programs: the directory ``services`` is
    imported from (this checkout, or site-packages) and the one ``mtc_program`` is (the SDK's
    own source root in a checkout; the same site-packages when installed)."""
    roots = (Path(__file__).resolve().parents[2], Path(mtc_program.__file__).resolve().parents[1])
    return os.pathsep.join(dict.fromkeys(str(r) for r in roots))

@dataclass(frozen=True)
class Recipe:
    name: str
    version: int
    description: str
    body: Mapping[str, Any]  # the resolved recipe (size and overrides applied)

    @property
    def expected_loss(self) -> tuple[float, float]:
        rng = self.body["expected_loss"]
        return float(rng["min"]), float(rng["max"])

    def within(self, loss: float) -> bool:
        low, high = self.expected_loss
        return low <= loss <= high

    @property
    def expected_reward(self) -> tuple[float, float]:
        """The RL recipe's (min, min_gain): the end's reward floor and its gain over the start."""
        rng = self.body["expected_reward"]
        return float(rng["min"]), float(rng["min_gain"])

    def reward_within(self, start: float, end: float) -> bool:
        floor, gain = self.expected_reward
        return end >= floor and end - start >= gain


def _data_files() -> dict[str, str]:
    root = resources.files("services.recipes") / "data"
    return {p.name[: -len(".yaml")]: p.read_text() for p in root.iterdir()
            if p.name.endswith(".yaml")}


def names() -> list[str]:
    return sorted(_data_files())


def raw(name: str) -> dict[str, Any]:
    files = _data_files()
    if name not in files:
        raise NotFound("recipe", f"{name} (recipes: {', '.join(sorted(files))})")
    body = yaml_text.safe_load(files[name])
    if not isinstance(body, dict) or not isinstance(body.get("version"), int):
        raise ValidationError("version", f"recipe {name} has no integer version")
    return body


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> None:
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = copy.deepcopy(value)


def parse_set(items: Sequence[str]) -> list[tuple[list[str], Any]]:
    """``key.path=value`` pairs; the value is a YAML scalar (``3``, ``0.1``, ``gemma``)."""
    out = []
    for item in items:
        key, sep, value = item.partition("=")
        path = [p for p in key.strip().split(".") if p]
        if not sep or not path:
            raise ValidationError("--set", f"{item!r} is not key=value (e.g. "
                                  "hyperparameters.steps=100)")
        if path[0] not in (*SECTIONS, *TOP_KEYS):
            raise ValidationError("--set", f"{path[0]!r} is not a recipe key; keys: "
                                  f"{', '.join((*SECTIONS, *TOP_KEYS))}")
        out.append((path, yaml_text.safe_load(value) if value.strip() else None))
    return out


def resolve(name: str, overrides: Sequence[str] = ()) -> Recipe:
    """The recipe with its size (``--set size=tiny``) and overrides applied, checked."""
    body = raw(name)
    pairs = parse_set(overrides)
    size = next((v for p, v in pairs if p == ["size"]), None)
    sizes = body.pop("sizes", {}) or {}
    if size is not None:
        if size not in sizes:
            raise ValidationError("size", f"recipe {name} has sizes {sorted(sizes)}, not {size!r}")
        _merge(body, sizes[size])
        body["size"] = size
    for path, value in pairs:
        node = body
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValidationError("--set", f"{'.'.join(path)}: {part} is not a section")
        node[path[-1]] = value
    check(body)
    return Recipe(name=str(body["name"]), version=int(body["version"]),
                  description=str(body.get("description", "")), body=body)


def check(body: Mapping[str, Any]) -> None:
    """A clear error naming the field, for what the program would trip on later."""
    if body.get("task") not in TASKS:
        raise ValidationError("task", f"must be one of {', '.join(TASKS)}")
    if (body.get("model") or {}).get("family") not in FAMILIES:
        raise ValidationError("model.family", f"must be one of {', '.join(FAMILIES)}")
    hp = body.get("hyperparameters") or {}
    for key in ("steps", "batch_size"):
        if not isinstance(hp.get(key), int) or hp[key] < 1:
            raise ValidationError(f"hyperparameters.{key}", "must be a positive integer")
    if not isinstance(hp.get("lr"), int | float) or hp["lr"] <= 0:
        raise ValidationError("hyperparameters.lr", "must be a positive number")
    replicas = (body.get("parallelism") or {}).get("replicas")
    if not isinstance(replicas, int) or replicas < 1:
        raise ValidationError("parallelism.replicas", "must be a positive integer")
    if body.get("task") == "rl":
        _check_rl(body)
        return
    rng = body.get("expected_loss") or {}
    if not all(isinstance(rng.get(k), int | float) for k in ("min", "max")) or \
            rng["min"] > rng["max"]:
        raise ValidationError("expected_loss", "needs numbers min <= max")


def _check_rl(body: Mapping[str, Any]) -> None:
    rl = body.get("rl") or {}
    if not isinstance(rl.get("group_size"), int) or rl["group_size"] < 2:
        raise ValidationError("rl.group_size", "must be an integer >= 2 (advantages are "
                              "relative to the group)")
    for key in ("prompts_per_step", "max_new_tokens", "eval_prompts"):
        if not isinstance(rl.get(key), int) or rl[key] < 1:
            raise ValidationError(f"rl.{key}", "must be a positive integer")
    if not isinstance(rl.get("sft_steps", 0), int) or rl.get("sft_steps", 0) < 0:
        raise ValidationError("rl.sft_steps", "must be a non-negative integer")
    for key in ("temperature", "kl_coef"):
        if not isinstance(rl.get(key, 0), int | float) or rl.get(key, 0) < 0:
            raise ValidationError(f"rl.{key}", "must be a non-negative number")
    if not isinstance(rl.get("lr"), int | float) or rl["lr"] <= 0:
        raise ValidationError("rl.lr", "must be a positive number")
    kinds = rl.get("kinds", [0, 1, 2, 3])
    if not isinstance(kinds, list) or not kinds or any(k not in (0, 1, 2, 3) for k in kinds):
        raise ValidationError("rl.kinds", "must be a non-empty list of 0 (sum), 1 "
                              "(difference), 2 (reverse), 3 (upper)")
    rng = body.get("expected_reward") or {}
    if not all(isinstance(rng.get(k), int | float) for k in ("min", "min_gain")):
        raise ValidationError("expected_reward", "needs numbers min and min_gain")


def program_config(recipe: Recipe) -> dict[str, Any]:
    """What ``services.recipes.programs.lm`` (or ``.rl``) reads (``--config``)."""
    body = recipe.body
    keep = ("task", "model", "data", "hyperparameters", "checkpoint", "init_from", "rl")
    config = {k: copy.deepcopy(body[k]) for k in keep if body.get(k) is not None}
    config.update(name=recipe.name, version=recipe.version)
    return config


def custom_job(recipe: Recipe, *, python: str, pythonpath: str | None = None,
               cluster: str | None = None) -> dict[str, Any]:
    """The CustomJob body: pool 0 the chief (one replica, as Vertex requires), pool 1 the
    other ranks; the recipe's name and version as labels."""
    body = recipe.body
    par = body["parallelism"]
    machine: dict[str, Any] = {"machineType": par.get("machine_type", "n2-standard-8")}
    if par.get("accelerator_type"):
        machine.update(acceleratorType=par["accelerator_type"],
                       acceleratorCount=int(par.get("accelerator_count", 1)))
    env = [{"name": "PYTHONPATH", "value": pythonpath}] if pythonpath else []
    container = {"imageUri": str(body.get("image") or "local/mtc-recipes:latest"),
                 "command": [str(body.get("python") or python), "-m",
                             PROGRAMS.get(str(body.get("task")), PROGRAM)],
                 "args": ["--config", json.dumps(program_config(recipe), sort_keys=True)],
                 "env": env}
    pools: list[dict[str, Any]] = [{"machineSpec": machine, "replicaCount": 1,
                                    "containerSpec": container}]
    if par["replicas"] > 1:
        pools.append({"machineSpec": machine, "replicaCount": par["replicas"] - 1,
                      "containerSpec": copy.deepcopy(container)})
    spec: dict[str, Any] = {"workerPoolSpecs": pools}
    if cluster:
        spec["persistentResourceId"] = cluster
    if par.get("partition"):
        spec["scheduling"] = {"mtcPartition": par["partition"]}
    return {"displayName": f"recipe-{recipe.name}-v{recipe.version}",
            "labels": {"mtc-recipe": recipe.name, "mtc-recipe-version": str(recipe.version)},
            "jobSpec": spec}
