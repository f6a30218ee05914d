"""Endpoint, DeployedModel and the prediction messages (aiplatform v1) as proto3 JSON.

What mtc serves: dedicated resources (a machine spec, min and max replicas, autoscaling
metric specs, recorded), a traffic split across deployed models, predict and rawPredict.
Private service connect, encryption, explanations and shared resource pools are refused by
name. mtc's extension ``mtcReplicas`` on a DeployedModel shows where each replica runs.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from services.api.wire.custom_job import MAX_LABELS, MachineSpec, Unsupported
from services.api.wire.proto_json import Int32, Message, Timestamp

MAX_DEPLOYED = 100


class AutoscalingMetricSpec(Message):
    metric_name: str = Field(max_length=256)
    target: Int32 | None = Field(default=None, ge=0)
    monitored_resource_labels: dict[str, str] | None = None


class DedicatedResources(Message):
    machine_spec: MachineSpec
    min_replica_count: Int32 = Field(default=1, ge=1, le=1000)
    max_replica_count: Int32 | None = Field(default=None, ge=0, le=1000)
    required_replica_count: Int32 | None = Field(default=None, ge=0, le=1000)
    autoscaling_metric_specs: list[AutoscalingMetricSpec] = Field(default_factory=list,
                                                                  max_length=8)
    spot: bool | None = None


class ReplicaStatus(Message):
    """mtc's extension: one serving replica, where it runs and whether it takes requests."""

    replica: str
    node: str | None = None
    state: str
    attempt: Int32 | None = None


class ScaleEvent(Message):
    """mtc's extension: one change of a deployed model's replica count by the autoscaler."""

    time: Timestamp
    from_: Int32 = Field(alias="from")
    to: Int32
    load_per_s: float


class DeployedModel(Message):
    id: str | None = Field(default=None, max_length=128)
    model: str = Field(default="", max_length=1024)
    model_version_id: str | None = Field(default=None, max_length=128)
    display_name: str | None = Field(default=None, max_length=128)
    create_time: Timestamp | None = None
    dedicated_resources: DedicatedResources | None = None
    enable_access_logging: bool | None = None
    disable_container_logging: bool | None = None
    mtc_replicas: list[ReplicaStatus] | None = None
    mtc_cluster: str | None = None  # where its replicas run (output only)
    mtc_scale_events: list[ScaleEvent] | None = None

    automatic_resources: Unsupported = None
    shared_resources: Unsupported = None
    explanation_spec: Unsupported = None
    service_account: Unsupported = None
    private_endpoints: Unsupported = None
    faster_deployment_config: Unsupported = None
    system_labels: dict[str, str] | None = None


class Endpoint(Message):
    name: str | None = Field(default=None, max_length=1024)
    display_name: str = Field(default="", max_length=128)
    description: str | None = Field(default=None, max_length=8192)
    deployed_models: list[DeployedModel] = Field(default_factory=list, max_length=MAX_DEPLOYED)
    traffic_split: dict[str, Int32] = Field(default_factory=dict)
    etag: str | None = Field(default=None, max_length=256)
    labels: dict[str, str] = Field(default_factory=dict, max_length=MAX_LABELS)
    create_time: Timestamp | None = None
    update_time: Timestamp | None = None
    dedicated_endpoint_enabled: bool | None = None

    encryption_spec: Unsupported = None
    network: Unsupported = None
    private_service_connect_config: Unsupported = None
    predict_request_response_logging_config: Unsupported = None


class ListEndpointsResponse(Message):
    endpoints: list[Endpoint] = Field(default_factory=list)
    next_page_token: str = ""


class DeployModelRequest(Message):
    endpoint: str | None = Field(default=None, max_length=1024)
    deployed_model: DeployedModel
    traffic_split: dict[str, Int32] = Field(default_factory=dict)


class UndeployModelRequest(Message):
    endpoint: str | None = Field(default=None, max_length=1024)
    deployed_model_id: str = Field(max_length=128)
    traffic_split: dict[str, Int32] = Field(default_factory=dict)


class MutateDeployedModelRequest(Message):
    endpoint: str | None = Field(default=None, max_length=1024)
    deployed_model: DeployedModel
    update_mask: str = Field(max_length=1024)


class PredictRequest(Message):
    instances: list[Any] = Field(max_length=100_000)
    parameters: Any = None


class RawPredictRequest(Message):
    http_body: dict[str, Any] | None = None


class PredictResponse(Message):
    predictions: list[Any] = Field(default_factory=list)
    deployed_model_id: str = ""
    model: str = ""
    model_display_name: str = ""
    model_version_id: str = ""
