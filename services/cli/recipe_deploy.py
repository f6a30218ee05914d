"""`mtc recipe run NAME --deploy`: the registered model on an endpoint, asked once.

The endpoint is ``<recipe>-<job id>``; one replica on the machine type the recipe's job ran
on, served by the prebuilt PyTorch runtime (its causal-LM mode reads the recipe's
``save_pretrained`` directory and its byte-level tokenizer, docs/inference.md). A prompt of
the recipe's own kind goes to it and its completion is printed.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

from services.cli.client import Client, ClientError
from services.cli.commands_api import last_segment, operation_error

IMAGE = "us-docker.pkg.dev/vertex-ai/prediction/pytorch-cpu.2-4:latest"
PROMPTS = {"sft": "12+30=", "rl": "12+30=", "pretrain": "def "}  # the recipes' own kind of text
MAX_OUTPUT_TOKENS = 8


def container() -> dict[str, Any]:
    """The containerSpec a recipe's model is registered with: it can be deployed."""
    return {"imageUri": IMAGE}


def deploy(args: argparse.Namespace, client: Client, task: str, job: dict[str, Any],
           model: str, version: str) -> dict[str, Any]:
    parent = args.parent
    job_id = last_segment(job.get("name"))
    endpoint_id = re.sub(r"[^a-z0-9-]", "-", f"{args.name}-{job_id}".lower())[:63].rstrip("-")
    client.endpoint_call(parent, "POST", "", {"displayName": f"{args.name} {job_id}"},
                         {"endpointId": endpoint_id})
    pool = (job.get("jobSpec") or {}).get("workerPoolSpecs", [{}])[0]
    machine = {k: v for k, v in (pool.get("machineSpec") or {}).items()
               if k in ("machineType", "acceleratorType", "acceleratorCount")}
    op = client.endpoint_call(parent, "POST", f"{endpoint_id}:deployModel", {
        "deployedModel": {"model": f"{model}@{version}", "dedicatedResources": {
            "machineSpec": machine, "minReplicaCount": 1, "maxReplicaCount": 1}}}, None)
    op = client.wait_operation(op["name"], args.timeout)
    error = operation_error(op)
    if error is not None:
        raise error
    if not op.get("done"):
        raise ClientError("DEADLINE_EXCEEDED", f"the deploy on {endpoint_id} is not done after "
                          f"{args.timeout:g} s: `mtc endpoint get {endpoint_id}` shows it")
    prompt = PROMPTS.get(task, "")
    answer = client.endpoint_call(parent, "POST", f"{endpoint_id}:predict", {
        "instances": [prompt], "parameters": {"maxOutputTokens": MAX_OUTPUT_TOKENS}}, None)
    return {"endpoint": parent.child("endpoints", endpoint_id), "prompt": prompt,
            "completion": (answer.get("predictions") or [None])[0]}
