"""Resource names (AIP-122): ``projects/{project}/locations/{location}/{collection}/{id}``."""

from __future__ import annotations

import re
from dataclasses import dataclass

from services.api.errors import invalid

SEGMENT = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
RESOURCE_ID = re.compile(r"^[a-z]([a-z0-9-]{0,61}[a-z0-9])?$")
REQUEST_ID = re.compile(r"^[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}$")  # a UUID


@dataclass(frozen=True)
class Parent:
    project: str
    location: str

    @property
    def name(self) -> str:
        return f"projects/{self.project}/locations/{self.location}"

    def child(self, collection: str, resource_id: str) -> str:
        return f"{self.name}/{collection}/{resource_id}"


def parent(project: str, location: str) -> Parent:
    for what, value in (("project", project), ("location", location)):
        if not SEGMENT.fullmatch(value):  # match: "$" lets a trailing newline by
            raise invalid("parent", f"{what} {value!r} is not a valid {what} id")
    return Parent(project, location)


def resource_id(value: str, field: str) -> str:
    if not RESOURCE_ID.fullmatch(value):
        raise invalid(field, "must be 1-63 lowercase letters, digits and hyphens, start with a "
                      f"letter and not end with a hyphen; got {value!r}")
    return value
