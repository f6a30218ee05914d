"""Long-running operations (AIP-151) for creates, updates and deletes of heavy resources.

An Operation is a small record naming what it waits for (a cluster reaching READY at a given
generation, a cluster gone); whether it is done is read from that resource's state at the
time of the call, so no handler has to remember to finish it and a GET is never stale.
"""

from __future__ import annotations

import hashlib
from typing import Any

from services.api import ids
from services.api.errors import ApiError, not_found
from services.api.names import Parent
from services.api.wire.proto_json import timestamp
from shared.domain.model import ClusterState, NodeState
from shared.policies.rollout import ROLLOUTS, RolloutState

OPERATIONS = "operations"
TYPE = "type.googleapis.com/google.cloud.aiplatform"
EMPTY = {"@type": "type.googleapis.com/google.protobuf.Empty"}
METADATA = {
    ("cluster", "create"): f"{TYPE}.v1beta1.CreateModelDevelopmentClusterOperationMetadata",
    ("cluster", "update"): f"{TYPE}.v1beta1.UpdateModelDevelopmentClusterOperationMetadata",
    ("cluster", "delete"): f"{TYPE}.v1beta1.DeleteOperationMetadata",
    ("customJob", "delete"): f"{TYPE}.v1.DeleteOperationMetadata",
    ("model", "upload"): f"{TYPE}.v1.UploadModelOperationMetadata",
    ("model", "delete"): f"{TYPE}.v1.DeleteOperationMetadata",
    ("endpoint", "create"): f"{TYPE}.v1.CreateEndpointOperationMetadata",
    ("endpoint", "delete"): f"{TYPE}.v1.DeleteOperationMetadata",
    ("endpoint", "deployModel"): f"{TYPE}.v1.DeployModelOperationMetadata",
    ("endpoint", "undeployModel"): f"{TYPE}.v1.UndeployModelOperationMetadata",
    ("endpoint", "mutateDeployedModel"): f"{TYPE}.v1.MutateDeployedModelOperationMetadata",
    ("trainingPipeline", "delete"): f"{TYPE}.v1.DeleteOperationMetadata",
    ("hyperparameterTuningJob", "delete"): f"{TYPE}.v1.DeleteOperationMetadata",
    ("clusterNodes", "reportFaultyNodes"):
        f"{TYPE}.v1beta1.ReportFaultyNodesOperationMetadata",
    # mtc's extension (services.api.rollouts): a metadata type of its own
    ("clusterRollout", "rolloutSoftware"):
        "type.googleapis.com/mtc.v1beta1.RolloutSoftwareOperationMetadata",
}
ROLLOUT_TARGET, ROLLOUT_VERB = "clusterRollout", "rolloutSoftware"
NODES_TARGET = "clusterNodes"
# a reported node is on its way while in one of these; held by the guard, it waits for a person
IN_TRANSIT = frozenset({NodeState.PROVISIONING, NodeState.DRAINING, NodeState.DRAINED,
                        NodeState.REPAIRING, NodeState.VERIFYING})
DONE_AT_ONCE = ("customJob", "model", "trainingPipeline",  # their records change in the call
                "hyperparameterTuningJob", "endpoint")
DEPLOY = ("endpoint", "deployModel")  # finished once its replicas answer (``serving_router``)
CLUSTER_TYPE = f"{TYPE}.v1beta1.ModelDevelopmentCluster"


def operation_id(*parts: object) -> str:
    """Deterministic (a retried create gets the same Operation) and numeric, as Vertex's are."""
    digest = hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()
    return str(int(digest[:15], 16))


def start(uow: Any, parent: Parent, *, target: str, target_id: str, verb: str,
          generation: int, now: float, retention_s: float,
          response: dict[str, Any] | None = None, nodes: list[str] | None = None,
          rollout: tuple[str, str] | None = None) -> dict[str, Any]:
    """``response``: the answer of an operation done in the call (an upload's); ``nodes``:
    the nodes an operation on a cluster's nodes waits for; ``rollout``: (the rollout's id,
    the cluster's API id) a rollout's operation follows."""
    op_id = operation_id(target, target_id, verb, generation)
    existing = uow.record(OPERATIONS, op_id)
    if existing is not None:
        return existing  # type: ignore[no-any-return]
    record = {"id": op_id, "name": parent.child("operations", op_id), "parent": parent.name,
              "target": target, "target_id": target_id, "verb": verb,
              "generation": generation, "created": now, "time": now,
              "expire_at": now + retention_s, "cancelled": False}
    if response is not None:
        record["response"] = response
    if nodes is not None:
        record["nodes"] = nodes
    if rollout is not None:
        record["rollout"], record["api_cluster"] = rollout
    uow.put_record(OPERATIONS, op_id, record)
    return record


def load(uow: Any, parent: Parent, op_id: str) -> dict[str, Any]:
    record = uow.record(OPERATIONS, op_id, where={"parent": parent.name})  # parent first
    if record is None:
        raise not_found(parent.child("operations", op_id))
    return record  # type: ignore[no-any-return]


def render(uow: Any, record: dict[str, Any], now: float,
           cluster_json: Any = None) -> dict[str, Any]:
    """The Operation as the API writes it; ``cluster_json(cluster)`` renders a response."""
    done, error, response, updated = _progress(uow, record, now, cluster_json)
    out: dict[str, Any] = {
        "name": record["name"],
        "metadata": {"@type": METADATA[(record["target"], record["verb"])],
                     "genericMetadata": {"createTime": timestamp(record["created"]),
                                         "updateTime": timestamp(updated)}},
        "done": done,
    }
    if record["target"] == ROLLOUT_TARGET:
        out["metadata"]["mtcRollout"] = rollout_view(_rollout(uow, record), record)
    if done and error is not None:
        out["error"] = error
    elif done:
        out["response"] = response
    return out


def _progress(uow: Any, record: dict[str, Any], now: float, cluster_json: Any
              ) -> tuple[bool, dict[str, Any] | None, dict[str, Any], float]:
    if record.get("cancelled"):
        return True, {"code": 1, "message": "the operation was cancelled"}, EMPTY, record["time"]
    if (record["target"], record["verb"]) == DEPLOY:
        from services.api.serving_router import deploy_progress  # it reads jobs and replicas

        done, error, response = deploy_progress(uow, record)
        return done, error, response or EMPTY, record["created"] if done else now
    if record["target"] in DONE_AT_ONCE:  # the job record is gone at once, a model uploaded
        return True, None, record.get("response") or EMPTY, record["created"]
    if record["target"] == NODES_TARGET:
        return _nodes_progress(uow, record, now)
    if record["target"] == ROLLOUT_TARGET:
        return _rollout_progress(uow, record, now, cluster_json)
    cluster = uow.clusters.get(record["target_id"])
    gone = cluster is None or cluster.state is ClusterState.DELETED
    if record["verb"] == "delete":
        return (True, None, EMPTY, cluster.updated_at if cluster else now) if gone else (
            False, None, EMPTY, now)
    if gone:
        return True, {"code": 10, "message": "the cluster was deleted before it was ready"}, \
            EMPTY, now
    assert cluster is not None
    superseded = cluster.generation > record["generation"]
    if cluster.state is ClusterState.READY or superseded:
        body = {"@type": CLUSTER_TYPE, **(cluster_json(cluster) if cluster_json else {})}
        return True, None, body, cluster.updated_at
    if cluster.state is ClusterState.FAILED:
        return True, {"code": 13, "message": cluster.message or "provisioning failed"}, \
            EMPTY, cluster.updated_at
    return False, None, EMPTY, now


def _nodes_progress(uow: Any, record: dict[str, Any], now: float
                    ) -> tuple[bool, dict[str, Any] | None, dict[str, Any], float]:
    """Done once no reported node is on its way: back in service (under its own name), held
    by the blast-radius guard, or needing a person."""
    nodes = [uow.nodes.get(n) for n in record.get("nodes", ())]
    if any(n is not None and n.state in IN_TRANSIT for n in nodes):
        return False, None, EMPTY, now
    failed = [n.node_id for n in nodes if n is not None and n.state is NodeState.FAILED]
    updated = max([record["created"], *(n.since for n in nodes if n is not None)])
    if failed:
        return True, {"code": 9, "message": f"node(s) {', '.join(failed)} need a person "
                      "(repair failed)"}, EMPTY, updated
    return True, None, EMPTY, updated


def _rollout(uow: Any, record: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = uow.record(ROLLOUTS, record["rollout"]) or {}
    return found


def _rollout_progress(uow: Any, record: dict[str, Any], now: float, cluster_json: Any
                      ) -> tuple[bool, dict[str, Any] | None, dict[str, Any], float]:
    """Done once every node runs the new version, or once a regression rolled it back."""
    rollout = _rollout(uow, record)
    state, updated = rollout.get("state"), rollout.get("time", now)
    if state == RolloutState.ROLLED_BACK:
        return True, {"code": 10, "message": f"rolled back: {rollout['reason']}"}, EMPTY, \
            updated
    if state == RolloutState.SUCCEEDED:
        cluster = uow.clusters.get(record["target_id"])
        body = {"@type": CLUSTER_TYPE, **(cluster_json(cluster) if cluster_json and cluster
                                          else {})}
        return True, None, body, updated
    return False, None, EMPTY, updated


def rollout_view(rollout: dict[str, Any], record: dict[str, Any]) -> dict[str, Any]:
    """``metadata.mtcRollout``: the version, the waves (nodes under the cluster's API id) and
    where the rollout stands; ``wave`` counts from 1."""
    if not rollout:
        return {}
    state, current = rollout["state"], rollout["wave"]

    def wave_state(i: int) -> str:
        if state == RolloutState.SUCCEEDED or (i < current and state == RolloutState.RUNNING):
            return "DONE"
        if state in (RolloutState.ROLLING_BACK, RolloutState.ROLLED_BACK):
            return state if i <= current else "SKIPPED"
        return "RUNNING" if i == current else "PENDING"

    cluster, api = rollout["cluster_id"], record.get("api_cluster", rollout["cluster_id"])
    return {"rollout": rollout["id"], "state": state, "version": rollout["version"],
            "waveSize": rollout["wave_size"], "canary": rollout["canary"],
            "wave": current + 1, "reason": rollout["reason"],
            "pausedWave": rollout.get("paused_wave"),
            "waves": [{"nodes": [ids.api_node(cluster, api, n) for n in wave],
                       "state": wave_state(i)} for i, wave in enumerate(rollout["waves"])]}


def cancel(uow: Any, record: dict[str, Any], now: float, cancel_target: Any) -> None:
    """A create not yet done is cancelled by deleting what it was creating; the rest cannot
    be taken back once started."""
    done, *_ = _progress(uow, record, now, None)
    if done:
        return
    if record["verb"] != "create":
        raise ApiError("FAILED_PRECONDITION", f"a {record['verb']} cannot be cancelled once "
                       "started")
    cancel_target(record["target_id"])
    uow.put_record(OPERATIONS, record["id"], {**record, "cancelled": True, "time": now})


def listed(uow: Any, parent: Parent) -> list[dict[str, Any]]:
    return sorted(uow.records(OPERATIONS, {"parent": parent.name}),
                  key=lambda r: (r["created"], r["id"]))


def delete(uow: Any, record: dict[str, Any]) -> None:
    uow.delete_record(OPERATIONS, record["id"])
