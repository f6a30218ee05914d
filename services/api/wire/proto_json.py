"""proto3 JSON, the way Google's REST APIs read and write it, as pydantic types.

- field names: lowerCamelCase on output; lowerCamelCase or the proto's snake_case on input;
- unknown fields are an error (``extra="forbid"``) naming the field;
- int64: a decimal string on output, a string or a number on input;
- enums: the name on output, the name or the number on input (the Python SDK's REST
  transport sends ``$alt=json;enum-encoding=int``);
- Duration: ``"3600s"`` (fractions allowed); Timestamp: RFC 3339 in UTC with ``Z``.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, PlainSerializer, WithJsonSchema
from pydantic.alias_generators import to_camel
from pydantic.functional_validators import BeforeValidator

MAX_INT64 = 2**63 - 1
_DURATION = re.compile(r"^(-?\d{1,12})(\.\d{1,9})?s$")


class Message(BaseModel):
    """Base of every wire message: camelCase out, either case in, unknown fields refused."""

    model_config = ConfigDict(alias_generator=to_camel, validate_by_name=True,
                              validate_by_alias=True, serialize_by_alias=True, extra="forbid",
                              frozen=True, str_max_length=65536)

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


def _int64(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError("must be an integer")
    if isinstance(value, int):
        out = value
    elif isinstance(value, float) and value.is_integer():
        out = int(value)
    elif isinstance(value, str) and re.fullmatch(r"-?\d{1,19}", value.strip()):
        out = int(value.strip())
    else:
        raise ValueError(f"must be an integer (a number or a decimal string), got {value!r}")
    if not -MAX_INT64 - 1 <= out <= MAX_INT64:
        raise ValueError("is out of the int64 range")
    return out


def _int32(value: Any) -> int:
    out = _int64(value)
    if not -(2**31) <= out < 2**31:
        raise ValueError("is out of the int32 range")
    return out


Int64 = Annotated[int, BeforeValidator(_int64), PlainSerializer(str, return_type=str),
                  WithJsonSchema({"oneOf": [{"type": "string", "pattern": r"^-?\d{1,19}$"},
                                            {"type": "integer"}],
                                  "description": "int64, as proto3 JSON writes it (a string)"})]
Int32 = Annotated[int, BeforeValidator(_int32),
                  WithJsonSchema({"type": "integer", "format": "int32"})]


def duration_seconds(text: str) -> float:
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"must be a Duration like '3600s' or '1.5s', got {text!r}")
    return float(match.group(1) + (match.group(2) or ""))


def format_duration(seconds: float) -> str:
    whole = int(seconds)
    frac = seconds - whole
    return f"{whole}s" if abs(frac) < 1e-9 else f"{seconds:.9f}".rstrip("0") + "s"


def _duration(value: Any) -> float:
    if not isinstance(value, str):
        raise ValueError(f"must be a Duration string like '3600s', got {type(value).__name__}")
    return duration_seconds(value)


Duration = Annotated[float, BeforeValidator(_duration),
                     PlainSerializer(format_duration, return_type=str),
                     WithJsonSchema({"type": "string", "pattern": r"^-?\d{1,12}(\.\d{1,9})?s$",
                                     "description": "google.protobuf.Duration"})]


def timestamp(ts: float | None) -> str | None:
    """RFC 3339 with microseconds and Z, as Google APIs print Timestamps."""
    if ts is None:
        return None
    return dt.datetime.fromtimestamp(ts, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


Timestamp = Annotated[str, WithJsonSchema({"type": "string", "format": "date-time"})]


def enum_parser(name: str, numbers: Mapping[str, int]) -> BeforeValidator:
    """An enum field reads a name or a number; it always holds (and writes) the name."""
    by_number = {v: k for k, v in numbers.items()}

    def parse(value: Any) -> str:
        if isinstance(value, bool):
            raise ValueError(f"must be a {name} name or number")
        if isinstance(value, int) and value in by_number:
            return by_number[value]
        if isinstance(value, str) and value in numbers:
            return value
        raise ValueError(f"must be one of {', '.join(numbers)} (or its number), got {value!r}")

    return BeforeValidator(parse)


def enum_schema(name: str, numbers: Mapping[str, int]) -> WithJsonSchema:
    return WithJsonSchema({"oneOf": [{"type": "string", "enum": list(numbers)},
                                     {"type": "integer", "enum": sorted(numbers.values())}],
                           "description": f"{name}: by name (as written) or number"})
