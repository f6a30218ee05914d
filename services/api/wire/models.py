"""Model (the Model Registry) and TrainingPipeline (aiplatform v1) as proto3 JSON.

The Model fields the registry keeps are recorded and returned; a model with a container is
served by endpoints (``services.api.endpoints``); explanations, encryption and the list of
deployed models are refused by name. mtc's extension
``mtcLineage`` says which job, attempt, checkpoint and inputs a version came from.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from services.api.wire.custom_job import MAX_ARGS, MAX_LABELS, EnvVar, RpcStatus, Unsupported
from services.api.wire.proto_json import (
    Duration,
    Int32,
    Int64,
    Message,
    Timestamp,
    enum_parser,
    enum_schema,
)

PIPELINE_STATES = {"PIPELINE_STATE_UNSPECIFIED": 0, "PIPELINE_STATE_QUEUED": 1,
                   "PIPELINE_STATE_PENDING": 2, "PIPELINE_STATE_RUNNING": 3,
                   "PIPELINE_STATE_SUCCEEDED": 4, "PIPELINE_STATE_FAILED": 5,
                   "PIPELINE_STATE_CANCELLING": 6, "PIPELINE_STATE_CANCELLED": 7,
                   "PIPELINE_STATE_PAUSED": 8}
PipelineStateName = Annotated[str, enum_parser("PipelineState", PIPELINE_STATES),
                              enum_schema("PipelineState", PIPELINE_STATES)]
MAX_ALIASES = 32


class Port(Message):
    container_port: Int32 | None = Field(default=None, ge=1, le=65535)


class ModelContainerSpec(Message):
    """How the model is served (``shared.service_layer.serving``): its command, or a
    prebuilt PyTorch prediction image; the routes and env its replicas get."""

    image_uri: str = Field(default="", max_length=1024)
    command: list[str] = Field(default_factory=list, max_length=MAX_ARGS)
    args: list[str] = Field(default_factory=list, max_length=MAX_ARGS)
    env: list[EnvVar] = Field(default_factory=list, max_length=MAX_ARGS)
    ports: list[Port] = Field(default_factory=list, max_length=16)
    grpc_ports: list[Port] = Field(default_factory=list, max_length=16)
    predict_route: str | None = Field(default=None, max_length=1024)
    health_route: str | None = Field(default=None, max_length=1024)
    invoke_route_prefix: str | None = Field(default=None, max_length=1024)
    deployment_timeout: Duration | None = Field(default=None, ge=0, le=7200)
    shared_memory_size_mb: Int64 | None = Field(default=None, ge=0)
    startup_probe: dict[str, Any] | None = None
    health_probe: dict[str, Any] | None = None
    liveness_probe: dict[str, Any] | None = None


class LineageInputs(Message):
    """What the chief replica ran: its command, args, env, and the job's output directory."""

    command: list[str] = Field(default_factory=list)
    args: list[str] = Field(default_factory=list)
    env: list[EnvVar] = Field(default_factory=list)
    base_output_directory: str | None = None


class ModelLineage(Message):
    """mtc's extension on a Model version: where it came from. On upload only ``job`` may be
    given (a CustomJob of the same project and location); the server fills in the rest."""

    job: str | None = Field(default=None, max_length=1024)
    attempt: Int32 | None = None
    checkpoint_step: Int64 | None = None
    checkpoint_path: str | None = None
    training_pipeline: str | None = None
    tuning_job: str | None = None  # a tuning-task pipeline's model: the study and its best
    trial: str | None = None  # trial (whose CustomJob is ``job``)
    inputs: LineageInputs | None = None


class Model(Message):
    name: str | None = Field(default=None, max_length=1024)
    version_id: str | None = Field(default=None, max_length=128)
    version_aliases: list[str] = Field(default_factory=list, max_length=MAX_ALIASES)
    version_create_time: Timestamp | None = None
    version_update_time: Timestamp | None = None
    display_name: str = Field(default="", max_length=128)
    description: str | None = Field(default=None, max_length=8192)
    version_description: str | None = Field(default=None, max_length=8192)
    metadata_schema_uri: str | None = Field(default=None, max_length=1024)
    metadata: Any = None
    predict_schemata: dict[str, Any] | None = None
    training_pipeline: str | None = None
    container_spec: ModelContainerSpec | None = None
    artifact_uri: str | None = Field(default=None, max_length=2048)
    create_time: Timestamp | None = None
    update_time: Timestamp | None = None
    etag: str | None = Field(default=None, max_length=256)
    labels: dict[str, str] = Field(default_factory=dict, max_length=MAX_LABELS)
    mtc_lineage: ModelLineage | None = None
    # output only: a model with a container is served on dedicated replicas (endpoints)
    supported_deployment_resources_types: list[str] = Field(default_factory=list, max_length=3)

    explanation_spec: Unsupported = None
    encryption_spec: Unsupported = None
    base_model_source: Unsupported = None
    deployed_models: Unsupported = None
    pipeline_job: Unsupported = None


class UploadModelRequest(Message):
    model: Model
    model_id: str | None = Field(default=None, max_length=128)
    parent_model: str | None = Field(default=None, max_length=1024)
    parent: str | None = Field(default=None, max_length=1024)
    service_account: Unsupported = None


class UploadModelResponse(Message):
    model: str
    model_version_id: str


class ListModelsResponse(Message):
    models: list[Model] = Field(default_factory=list)
    next_page_token: str = ""


class ListModelVersionsResponse(Message):
    models: list[Model] = Field(default_factory=list)
    next_page_token: str = ""


class MergeVersionAliasesRequest(Message):
    name: str | None = Field(default=None, max_length=1024)
    version_aliases: list[str] = Field(default_factory=list, max_length=MAX_ALIASES)


class TrainingPipeline(Message):
    name: str | None = None
    display_name: str = Field(default="", max_length=128)
    training_task_definition: str = Field(default="", max_length=1024)
    training_task_inputs: dict[str, Any] | None = None
    training_task_metadata: dict[str, Any] | None = None
    model_to_upload: Model | None = None
    model_id: str | None = Field(default=None, max_length=128)
    parent_model: str | None = Field(default=None, max_length=1024)
    state: PipelineStateName | None = None
    error: RpcStatus | None = None
    create_time: Timestamp | None = None
    start_time: Timestamp | None = None
    end_time: Timestamp | None = None
    update_time: Timestamp | None = None
    labels: dict[str, str] = Field(default_factory=dict, max_length=MAX_LABELS)

    input_data_config: Unsupported = None
    encryption_spec: Unsupported = None


class ListTrainingPipelinesResponse(Message):
    training_pipelines: list[TrainingPipeline] = Field(default_factory=list)
    next_page_token: str = ""
