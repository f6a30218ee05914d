"""HyperparameterTuningJob (aiplatform v1) as proto3 JSON: StudySpec, Trial, Measurement.

What mtc cannot honour is refused by name (conditional parameters, convex stopping, study
stopping configs, safety metrics, encryption), as in ``wire.custom_job``.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from services.api.wire.custom_job import (
    MAX_LABELS,
    CustomJobSpec,
    JobStateName,
    RpcStatus,
    Unsupported,
)
from services.api.wire.proto_json import (
    Duration,
    Int32,
    Int64,
    Message,
    Timestamp,
    enum_parser,
    enum_schema,
)

GOALS = {"GOAL_TYPE_UNSPECIFIED": 0, "MAXIMIZE": 1, "MINIMIZE": 2}
SCALES = {"SCALE_TYPE_UNSPECIFIED": 0, "UNIT_LINEAR_SCALE": 1, "UNIT_LOG_SCALE": 2,
          "UNIT_REVERSE_LOG_SCALE": 3}
ALGORITHMS = {"ALGORITHM_UNSPECIFIED": 0, "GRID_SEARCH": 2, "RANDOM_SEARCH": 3}
SELECTIONS = {"MEASUREMENT_SELECTION_TYPE_UNSPECIFIED": 0, "LAST_MEASUREMENT": 1,
              "BEST_MEASUREMENT": 2}
NOISE = {"OBSERVATION_NOISE_UNSPECIFIED": 0, "LOW": 1, "HIGH": 2}
TRIAL_STATES = {"STATE_UNSPECIFIED": 0, "REQUESTED": 1, "ACTIVE": 2, "STOPPING": 3,
                "SUCCEEDED": 4, "INFEASIBLE": 5}
Goal = Annotated[str, enum_parser("GoalType", GOALS), enum_schema("GoalType", GOALS)]
Scale = Annotated[str, enum_parser("ScaleType", SCALES), enum_schema("ScaleType", SCALES)]
Algorithm = Annotated[str, enum_parser("Algorithm", ALGORITHMS),
                      enum_schema("Algorithm", ALGORITHMS)]
Selection = Annotated[str, enum_parser("MeasurementSelectionType", SELECTIONS),
                      enum_schema("MeasurementSelectionType", SELECTIONS)]
Noise = Annotated[str, enum_parser("ObservationNoise", NOISE),
                  enum_schema("ObservationNoise", NOISE)]
TrialState = Annotated[str, enum_parser("Trial.State", TRIAL_STATES),
                       enum_schema("Trial.State", TRIAL_STATES)]
MAX_PARAMS = 100
MAX_VALUES = 1000
MAX_TRIALS = 10_000
ParamId = Annotated[str, Field(max_length=128, pattern=r"^[A-Za-z_][A-Za-z0-9_.-]*$")]
CategoryValue = Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[^\s=]+$")]


class MetricSpec(Message):
    metric_id: str = Field(max_length=128, pattern=r"^[^\s]+$")
    goal: Goal = "GOAL_TYPE_UNSPECIFIED"
    safety_config: Unsupported = None


class DoubleValueSpec(Message):
    min_value: float = Field(allow_inf_nan=False)
    max_value: float = Field(allow_inf_nan=False)
    default_value: float | None = Field(default=None, allow_inf_nan=False)


class IntegerValueSpec(Message):
    min_value: Int64 = Field(ge=-(2**53), le=2**53)
    max_value: Int64 = Field(ge=-(2**53), le=2**53)
    default_value: Int64 | None = None


class CategoricalValueSpec(Message):
    values: list[CategoryValue] = Field(max_length=MAX_VALUES)
    default_value: str | None = Field(default=None, max_length=256)


class DiscreteValueSpec(Message):
    values: list[Annotated[float, Field(allow_inf_nan=False)]] = Field(max_length=MAX_VALUES)
    default_value: float | None = Field(default=None, allow_inf_nan=False)


class ParameterSpec(Message):
    parameter_id: ParamId
    double_value_spec: DoubleValueSpec | None = None
    integer_value_spec: IntegerValueSpec | None = None
    categorical_value_spec: CategoricalValueSpec | None = None
    discrete_value_spec: DiscreteValueSpec | None = None
    scale_type: Scale | None = None
    conditional_parameter_specs: Unsupported = None


class StoppingSpec(Message):
    """MedianAutomatedStoppingSpec and DecayCurveAutomatedStoppingSpec share one field."""

    use_elapsed_duration: bool | None = None


class StudySpec(Message):
    metrics: list[MetricSpec] = Field(default_factory=list, max_length=10)
    parameters: list[ParameterSpec] = Field(default_factory=list, max_length=MAX_PARAMS)
    algorithm: Algorithm | None = None
    observation_noise: Noise | None = None
    measurement_selection_type: Selection | None = None
    median_automated_stopping_spec: StoppingSpec | None = None
    decay_curve_stopping_spec: StoppingSpec | None = None
    convex_automated_stopping_spec: Unsupported = None
    study_stopping_config: Unsupported = None


class Metric(Message):
    metric_id: str
    value: float


class Measurement(Message):
    elapsed_duration: Duration | None = None
    step_count: Int64 | None = None
    metrics: list[Metric] = Field(default_factory=list)


class TrialParameter(Message):
    parameter_id: str
    value: float | str  # google.protobuf.Value: a number, or a categorical's string


class Trial(Message):
    name: str | None = None
    id: str = ""
    state: TrialState | None = None
    parameters: list[TrialParameter] = Field(default_factory=list)
    final_measurement: Measurement | None = None
    measurements: list[Measurement] = Field(default_factory=list)
    start_time: Timestamp | None = None
    end_time: Timestamp | None = None
    client_id: str | None = None
    infeasible_reason: str | None = None
    custom_job: str | None = None
    web_access_uris: dict[str, str] | None = None


class HyperparameterTuningJob(Message):
    name: str | None = None
    display_name: str = Field(default="", max_length=128)
    study_spec: StudySpec | None = None
    max_trial_count: Int32 = Field(default=0, ge=0, le=MAX_TRIALS)
    parallel_trial_count: Int32 = Field(default=0, ge=0, le=MAX_TRIALS)
    max_failed_trial_count: Int32 = Field(default=0, ge=0, le=MAX_TRIALS)
    trial_job_spec: CustomJobSpec | None = None
    trials: list[Trial] = Field(default_factory=list)
    state: JobStateName | None = None
    create_time: Timestamp | None = None
    start_time: Timestamp | None = None
    end_time: Timestamp | None = None
    update_time: Timestamp | None = None
    error: RpcStatus | None = None
    labels: dict[str, str] = Field(default_factory=dict, max_length=MAX_LABELS)
    satisfies_pzs: bool | None = None
    satisfies_pzi: bool | None = None

    encryption_spec: Unsupported = None


class ListHyperparameterTuningJobsResponse(Message):
    hyperparameter_tuning_jobs: list[HyperparameterTuningJob] = Field(default_factory=list)
    next_page_token: str = ""
