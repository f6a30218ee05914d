"""`mtc endpoint ...`: endpoints, their deployed models, and predictions (docs/inference.md).

Every call goes through the client's one endpoint call (``Client.endpoint_call``): in process
on the state directory, or to a server with ``--api``. Replicas run where a server runs
(`mtc serve`): a deploy waits on its Operation only with ``--wait``.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.table import Table

from services.cli.client import Client, ClientError
from services.cli.commands_api import _finish, last_segment, load_body, show, whole_ids


def endpoint_table(endpoints: list[dict[str, Any]]) -> Table:
    t = whole_ids(Table("ENDPOINT", "DISPLAY NAME", "DEPLOYED MODEL", "MODEL", "REPLICAS",
                        "TRAFFIC"))
    for e in endpoints:
        split = e.get("trafficSplit") or {}
        deployed = e.get("deployedModels") or [{}]
        for d in deployed:
            replicas = d.get("mtcReplicas") or []
            states = ", ".join(f"{r.get('node', '-')}:{r['state']}" for r in replicas)
            t.add_row(last_segment(e.get("name")), e.get("displayName", ""), d.get("id", "-"),
                      f"{last_segment(d.get('model'))}@{d.get('modelVersionId', '')}"
                      if d else "-", states or "-",
                      f"{split.get(d.get('id', ''), 0)}%" if d else "-")
    return t


def _deploy_body(args: argparse.Namespace, parent_name: str) -> dict[str, Any]:
    model = args.model if args.model.startswith("projects/") else \
        f"{parent_name}/models/{args.model}"
    machine: dict[str, Any] = {"machineType": args.machine_type}
    if args.accelerator_type:
        machine.update(acceleratorType=args.accelerator_type,
                       acceleratorCount=args.accelerator_count)
    resources: dict[str, Any] = {"machineSpec": machine, "minReplicaCount": args.min_replicas,
                                 "maxReplicaCount": max(args.max_replicas, args.min_replicas)}
    if args.target_requests_per_minute:
        resources["autoscalingMetricSpecs"] = [{
            "metricName": "aiplatform.googleapis.com/prediction/online/request_count",
            "target": args.target_requests_per_minute}]
    return {"deployedModel": {"model": model, "dedicatedResources": resources}}


def cmd_endpoint(args: argparse.Namespace, client: Client) -> None:
    parent = args.parent
    call = client.endpoint_call
    match args.action:
        case "create":
            op = call(parent, "POST", "", {"displayName": args.display_name},
                      {"endpointId": args.endpoint_id} if args.endpoint_id else None)
            made = op.get("response") or op
            show(made, args.json, lambda: endpoint_table([made]))
        case "list":
            found = call(parent, "GET", "", None, None).get("endpoints", [])
            show(found, args.json, lambda: endpoint_table(found), where=parent.name)
        case "get":
            got = call(parent, "GET", args.endpoint_id, None, None)
            show(got, args.json, lambda: endpoint_table([got]))
        case "deploy":
            op = call(parent, "POST", f"{args.endpoint_id}:deployModel",
                      _deploy_body(args, parent.name), None)
            op = _finish(client, args, op, f"deploying on endpoint {args.endpoint_id}")
            got = call(parent, "GET", args.endpoint_id, None, None)
            show(got, args.json, lambda: endpoint_table([got]))
        case "undeploy":
            call(parent, "POST", f"{args.endpoint_id}:undeployModel",
                 {"deployedModelId": args.deployed_model_id}, None)
            got = call(parent, "GET", args.endpoint_id, None, None)
            show(got, args.json, lambda: endpoint_table([got]))
        case "predict":
            body = load_body(args.file) if args.file else {"instances": _instances(args)}
            answer = call(parent, "POST", f"{args.endpoint_id}:predict", body, None)
            print(json.dumps(answer if args.json else answer.get("predictions"), indent=1))
        case "delete":
            call(parent, "DELETE", args.endpoint_id, None, None)
            print(f"{parent.child('endpoints', args.endpoint_id)}: deleted")


def _instances(args: argparse.Namespace) -> list[Any]:
    if not args.instances:
        raise ClientError("INVALID_ARGUMENT", "give --instances JSON or -f FILE",
                          [("instances", "is required")])
    value = json.loads(args.instances)
    if not isinstance(value, list):
        raise ClientError("INVALID_ARGUMENT", "--instances is a JSON list",
                          [("instances", "must be a list")])
    return value


def add_parser(sub: Any, leaf: Any) -> None:
    e = sub.add_parser("endpoint", help="create, list, get, deploy, undeploy, predict, delete "
                       "endpoints (a model's replicas on a cluster)")
    esub = e.add_subparsers(dest="action", required=True)
    x = leaf(esub, "create", "create an endpoint")
    x.add_argument("--display-name", required=True)
    x.add_argument("--endpoint-id", help="a client-chosen id (default: a number)")
    leaf(esub, "list")
    for name in ("get", "delete"):
        leaf(esub, name).add_argument("endpoint_id")
    x = leaf(esub, "deploy", "deploy a model version on replicas of a cluster's nodes")
    x.add_argument("endpoint_id")
    x.add_argument("--model", required=True, help="MODEL_ID[@VERSION] or its full name")
    x.add_argument("--machine-type", required=True, help="a node pool's machine type")
    x.add_argument("--accelerator-type")
    x.add_argument("--accelerator-count", type=int, default=0)
    x.add_argument("--min-replicas", type=int, default=1)
    x.add_argument("--max-replicas", type=int, default=0, help="above min: autoscaled")
    x.add_argument("--target-requests-per-minute", type=int, default=0,
                   help="the autoscaler's target per replica (default 600)")
    x.add_argument("--wait", type=float, default=0.0, metavar="S",
                   help="wait up to S seconds until every replica answers")
    x = leaf(esub, "undeploy", "undeploy a deployed model (its replicas stop)")
    x.add_argument("endpoint_id")
    x.add_argument("deployed_model_id")
    x = leaf(esub, "predict", "predictions from a ready replica")
    x.add_argument("endpoint_id")
    x.add_argument("--instances", help="a JSON list, e.g. '[[1.0, 2.0]]'")
    x.add_argument("-f", "--file", help='a PredictRequest JSON body ({"instances": ...})')
    e.set_defaults(fn=cmd_endpoint)
