"""`mtc recipe list|show|run`: the recipes of ``services/recipes`` as ordinary CustomJobs.

``run`` resolves the recipe (``--size``, ``--set key=value``), submits it through the same
client every API command uses (in process, or ``--api`` over HTTP), waits for the job to end
(locally it drives the control plane itself, as ``--wait`` does elsewhere), reads the final
loss and the model directory from rank 0's log of the last attempt, and uploads the model to
the registry: ``mtcLineage.job`` names the job (the server adds its attempt, checkpoint and
inputs), and the version's labels and metadata carry the recipe's name and version, the
parent model or directory it started from, and the loss against the recipe's range (for the
RL recipe: the held-out reward at RL's start and end against its ``expected_reward``).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any

from rich.table import Table

from services.cli import recipe_deploy
from services.cli.client import Client, ClientError
from services.cli.commands_api import console, last_segment, show
from services.recipes.catalog import Recipe, custom_job, names, program_pythonpath, raw, resolve

DONE_RE = re.compile(r"done at step (\d+): loss ([0-9.eE+-]+|nan|inf)")
MODEL_RE = re.compile(r"model saved: (\S.*)$")
REWARD_RE = re.compile(r"rl reward start ([0-9.eE+-]+|nan) end ([0-9.eE+-]+|nan)")



def add_parser(sub: Any, common: list[argparse.ArgumentParser]) -> None:
    r = sub.add_parser("recipe", help="list, show, run recipes (pretrain, continued "
                       "pretraining, SFT, RL) as CustomJobs; through --api too")
    rsub = r.add_subparsers(dest="action", required=True)
    rsub.add_parser("list", parents=common, help="the recipes and their versions")
    x = rsub.add_parser("show", parents=common, help="a recipe as resolved (YAML data)")
    x.add_argument("name")
    x.add_argument("--size", help="a named size of the recipe (e.g. tiny)")
    x.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    x = rsub.add_parser("run", parents=common, help="submit the recipe as a CustomJob, wait, "
                        "check its loss against the recipe's range, register the model")
    x.add_argument("name")
    x.add_argument("--size", help="a named size of the recipe (e.g. tiny)")
    x.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="override a recipe value, e.g. hyperparameters.steps=100, "
                   "model.family=gemma, parent_model=MODEL_ID (repeatable)")
    x.add_argument("--cluster", help="the cluster (persistentResourceId) to run on")
    x.add_argument("--job-id", help="a client-chosen job id")
    x.add_argument("--timeout", type=float, default=3600.0, metavar="S",
                   help="wait at most S seconds for the job (default 3600)")
    x.add_argument("--no-wait", action="store_true", help="submit and print the job only")
    x.add_argument("--deploy", action="store_true", help="then deploy the model on an "
                   "endpoint (one replica) and print its completion of a prompt")
    r.set_defaults(fn=cmd_recipe)


def _resolved(args: argparse.Namespace) -> Recipe:
    sets = ([f"size={args.size}"] if args.size else []) + list(args.sets)
    return resolve(args.name, sets)


def cmd_recipe(args: argparse.Namespace, client: Client | None) -> None:
    """``list`` and ``show`` read the packaged files (no client); ``run`` needs one."""
    match args.action:
        case "list":
            rows = [{"name": n, "version": (b := raw(n))["version"], "task": b.get("task"),
                     "sizes": sorted(b.get("sizes") or {}), "description": b.get("description")}
                    for n in names()]

            def table() -> Table:
                t = Table("RECIPE", "VERSION", "TASK", "SIZES", "DESCRIPTION")
                for r in rows:
                    t.add_row(r["name"], str(r["version"]), str(r["task"]),
                              ", ".join(r["sizes"]) or "-", str(r["description"]))
                return t

            show(rows, args.json, table)
        case "show":
            body = dict(_resolved(args).body)
            if args.json:
                print(json.dumps(body, indent=2))
            else:
                import yaml

                print(yaml.safe_dump(body, sort_keys=False), end="")
        case "run":
            assert client is not None
            run(args, client)


def run(args: argparse.Namespace, client: Client) -> None:
    recipe = _resolved(args)
    parent_model: str | None = recipe.body.get("parent_model")
    if parent_model:
        model = client.get_model(args.parent, last_segment(str(parent_model)))
        if not model.get("artifactUri"):
            raise ClientError("FAILED_PRECONDITION", f"model {parent_model} has no artifactUri "
                              "to start from", [("parent_model", "has no artifactUri")])
        recipe = resolve(recipe.name, [*_sets(args), f"init_from={model['artifactUri']}"])
        parent_model = f"{model.get('name')}@{model.get('versionId')}"
    if recipe.body.get("requires_parent") and not recipe.body.get("init_from"):
        raise ClientError("INVALID_ARGUMENT", f"recipe {recipe.name} continues from a model: "
                          "--set parent_model=MODEL_ID or --set init_from=DIR",
                          [("parent_model", "is required")])
    body = custom_job(recipe, python=sys.executable, pythonpath=program_pythonpath(),
                      cluster=args.cluster)
    job = client.create_job(args.parent, body, args.job_id)
    job_id = last_segment(job.get("name"))
    _say(args, f"submitted {job.get('name')} (recipe {recipe.name} v{recipe.version})")
    if args.no_wait:
        show(job, True)
        return
    job = client.wait_job(args.parent, job_id, args.timeout)
    state = job.get("state")
    if state != "JOB_STATE_SUCCEEDED":
        raise ClientError("FAILED_PRECONDITION", f"job {job_id} ended {state}: "
                          f"{(job.get('error') or {}).get('message', 'see mtc job logs')}")
    loss, model_dir, reward = _outcome(client, args, job_id)
    if recipe.body.get("task") == "rl":
        _finish_rl(args, client, recipe, job, model_dir, reward, parent_model)
        return
    low, high = recipe.expected_loss
    within = loss is not None and low <= loss <= high
    response = _register(args, client, recipe, job, model_dir, parent_model,
                         {"mtc-loss-in-range": "true" if within else "false"},
                         {"finalLoss": loss, "expectedLoss": [low, high],
                          "withinExpected": within})
    result = {"job": job.get("name"), "state": state, "finalLoss": loss,
              "expectedLoss": [low, high], "withinExpected": within,
              "model": response.get("model"), "modelVersionId": response.get("modelVersionId"),
              "artifactUri": model_dir}
    if within:
        result.update(_deploy(args, client, recipe, job, response))
    if args.json:
        show(result, True)
    else:
        console.print(f"job {job_id} {state}; loss {loss} (expected {low}..{high}: "
                      f"{'in range' if within else 'OUT OF RANGE'}); model {result['model']} "
                      f"version {result['modelVersionId']}")
        _say_deployed(result)
    if not within:
        raise ClientError("FAILED_PRECONDITION", f"final loss {loss} is outside the recipe's "
                          f"range {low}..{high}")


def _finish_rl(args: argparse.Namespace, client: Client, recipe: Recipe, job: dict[str, Any],
               model_dir: str | None, reward: tuple[float, float] | None,
               parent_model: str | None) -> None:
    """The RL recipe's end: its reward (start, end) against ``expected_reward``, the model
    registered with the same lineage as the others."""
    floor, gain = recipe.expected_reward
    start, end = reward if reward is not None else (None, None)
    within = reward is not None and recipe.reward_within(*reward)
    response = _register(args, client, recipe, job, model_dir, parent_model,
                         {"mtc-reward-in-range": "true" if within else "false"},
                         {"rewardStart": start, "rewardEnd": end,
                          "expectedReward": {"min": floor, "minGain": gain},
                          "withinExpected": within})
    result = {"job": job.get("name"), "state": job.get("state"), "rewardStart": start,
              "rewardEnd": end, "expectedReward": {"min": floor, "minGain": gain},
              "withinExpected": within, "model": response.get("model"),
              "modelVersionId": response.get("modelVersionId"), "artifactUri": model_dir}
    if within:
        result.update(_deploy(args, client, recipe, job, response))
    if args.json:
        show(result, True)
    else:
        console.print(f"job {last_segment(job.get('name'))} {job.get('state')}; reward {start} "
                      f"-> {end} (expected >= {floor}, gain >= {gain}: "
                      f"{'in range' if within else 'OUT OF RANGE'}); model {result['model']} "
                      f"version {result['modelVersionId']}")
        _say_deployed(result)
    if not within:
        raise ClientError("FAILED_PRECONDITION", f"reward {start} -> {end} misses the recipe's "
                          f"expectation (end >= {floor}, gain >= {gain})")


def _deploy(args: argparse.Namespace, client: Client, recipe: Recipe, job: dict[str, Any],
            response: dict[str, Any]) -> dict[str, Any]:
    """``--deploy`` (a model within the recipe's expectation): where it is served and its
    completion of a prompt; {} without it."""
    if not getattr(args, "deploy", False):
        return {}
    return {"deployed": recipe_deploy.deploy(args, client, str(recipe.body.get("task")), job,
                                             str(response.get("model")),
                                             str(response.get("modelVersionId")))}


def _say_deployed(result: dict[str, Any]) -> None:
    served = result.get("deployed")
    if served:
        console.print(f"deployed on {served['endpoint']}: {served['prompt']!r} -> "
                      f"{served['completion']!r}")


def _register(args: argparse.Namespace, client: Client, recipe: Recipe, job: dict[str, Any],
              model_dir: str | None, parent_model: str | None, labels: dict[str, str],
              metadata: dict[str, Any]) -> dict[str, Any]:
    """The recipe's model into the registry with its lineage (job, recipe, version, parent)
    and the recipe's own verdict (``labels``/``metadata``); the upload Operation's response."""
    lineage_parent = str(parent_model or recipe.body.get("init_from") or "")
    labels = {"mtc-recipe": recipe.name, "mtc-recipe-version": str(recipe.version), **labels}
    if parent_model:
        labels["mtc-parent-model"] = last_segment(str(parent_model)).split("@")[0][:63]
    metadata = {"recipe": recipe.name, "recipeVersion": recipe.version,
                "size": recipe.body.get("size") or "default", "parent": lineage_parent or None,
                **metadata}
    upload = {"model": {"displayName": f"{recipe.name}-v{recipe.version}",
                        "description": f"recipe {recipe.name} v{recipe.version}"
                        + (f" from {lineage_parent}" if lineage_parent else ""),
                        "artifactUri": model_dir, "labels": labels, "metadata": metadata,
                        "containerSpec": recipe_deploy.container(),
                        "mtcLineage": {"job": job.get("name")}}}
    op = client.upload_model(args.parent, upload)
    if not op.get("done"):
        op = client.wait_operation(op["name"], 60.0)
    return dict(op.get("response") or {})


def _sets(args: argparse.Namespace) -> list[str]:
    return ([f"size={args.size}"] if args.size else []) + list(args.sets)


def _say(args: argparse.Namespace, text: str) -> None:
    print(text, file=sys.stderr if args.json else sys.stdout, flush=True)


def _outcome(client: Client, args: argparse.Namespace, job_id: str
             ) -> tuple[float | None, str | None, tuple[float, float] | None]:
    """The final loss, the model directory and (RL) the reward's start and end, from rank 0's
    log of the newest attempt."""
    loss: float | None = None
    reward: tuple[float, float] | None = None
    model_dir: str | None = None
    token: str | None = None
    attempt: int | None = None
    while True:
        page = client.read_job_logs(args.parent, job_id, attempt=attempt, rank=0, token=token)
        attempt = int(page.get("attempt") or 0) or attempt
        for line in page.get("lines") or []:
            text = line if isinstance(line, str) else str(line.get("text", line))
            if m := DONE_RE.search(text):
                loss = float(m.group(2))
            if m := REWARD_RE.search(text):
                reward = (float(m.group(1)), float(m.group(2)))
            if m := MODEL_RE.search(text):
                model_dir = m.group(1).strip()
        token = page.get("nextPageToken") or None
        if not token or not page.get("lines"):
            return loss, model_dir, reward
