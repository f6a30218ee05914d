"""Resource ids per parent: the one mapper between an API id and the domain's id.

A client-chosen id (a cluster's ``modelDevelopmentClusterId``, a ``modelId``, a
``customJobId``...) lives in its parent's namespace, as Vertex's do: projects A and B may
each have a cluster ``ca``. The domain (clusters, jobs, nodes, the registry) and the API's
records keep one flat namespace, so every entry point turns the API id into a **domain id**,
a pure function of (parent, API id) and of two values pinned once per deployment:

- the **home parent**, whose domain ids are its API ids unchanged: the parent of the oldest
  record when the pin is written (an existing single-project state directory keeps its ids,
  its node names and its records' keys), else the first parent that creates something;
- a random **salt**. Another parent's id is ``{API id, cut to 50}-{tag}``, the tag 12 base32
  characters of HMAC-SHA256(salt, "parent/API id"): nothing another project holds changes
  it (no "id is taken" tells B what A has), and without the salt no one can work out
  another project's domain ids to take them first.

Server-assigned ids (numbers: custom jobs, tuning jobs, operations, uploaded models) are
random or derived per parent, never collide, and pass through unchanged; client-chosen ids
start with a letter (``names.resource_id``), so the two never mix.

The pin is a record (``api_tenancy/home``) in the same store, written in the unit of work of
the first create (sqlite: ``BEGIN IMMEDIATE`` serialises two first creates; Firestore: the
transaction retries).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import Any

from services.api.names import Parent
from shared.adapters.docstore import API_RESOURCES

TENANCY = "api_tenancy"
HOME = "home"
TAG_CHARS = 12  # 60 bits
MAX_ID = 63  # the domain's id limit (shared.domain.specs.ID_PATTERN)
_LEGACY = (API_RESOURCES, "registry_models")  # what a state directory before the pin holds


@dataclass(frozen=True)
class Ids:
    """The deployment's pin; ``home`` None: nothing pinned yet (every id is its own)."""

    home: str | None
    salt: str

    def domain(self, parent: Parent, api_id: str) -> str:
        """The domain id of ``api_id`` under ``parent``."""
        if self.home is None or parent.name == self.home or not api_id[:1].isalpha():
            return api_id
        digest = hmac.new(self.salt.encode(), f"{parent.name}/{api_id}".encode(),
                          hashlib.sha256).digest()
        tag = base64.b32encode(digest).decode().lower()[:TAG_CHARS]
        return f"{api_id[:MAX_ID - 1 - TAG_CHARS]}-{tag}"


def current(uow: Any) -> Ids:
    """The pin as stored (a read: nothing is written)."""
    pin = uow.record(TENANCY, HOME)
    return Ids(None, "") if pin is None else Ids(str(pin["parent"]), str(pin["salt"]))


def pinned(uow: Any, parent: Parent, now: float) -> Ids:
    """The pin, written first if there is none (a create's unit of work calls this)."""
    ids = current(uow)
    if ids.home is not None:
        return ids
    home = _oldest_parent(uow) or parent.name
    uow.put_record(TENANCY, HOME, {"parent": home, "salt": secrets.token_hex(16),
                                   "time": now})
    return current(uow)


def domain(uow: Any, parent: Parent, api_id: str) -> str:
    """The domain id of ``api_id`` under ``parent`` (a lookup: nothing pinned is written)."""
    return current(uow).domain(parent, api_id)


def domain_of(record: dict[str, Any]) -> str:
    """A record's domain id (records written before the mapper carry only their id)."""
    return str(record.get("domain") or record["id"])


def _oldest_parent(uow: Any) -> str | None:
    oldest: tuple[float, str] | None = None
    for collection in _LEGACY:
        for record in uow.records(collection, {}):
            if "parent" in record and "created" in record:
                key = (float(record["created"]), str(record["parent"]))
                oldest = key if oldest is None or key < oldest else oldest
    return None if oldest is None else oldest[1]


def _named(cluster_id: str) -> str:
    """How a cluster's id begins its nodes' names (provisioning's ``node_name``: an id's own
    hyphens doubled, a single hyphen the separator)."""
    return f"{cluster_id.replace('-', '--')}-"


def api_node(domain_cluster: str, api_cluster: str, node_id: str) -> str:
    """A node's id as its project sees it: a node of another parent's cluster is named after
    the cluster's domain id (``<ca--tag>-<pool>-<index>``); its project reads it under the
    cluster's own id (``ca-<pool>-<index>``, the shape Vertex's ``nodeId`` has), which
    ``domain_node`` takes back."""
    prefix = _named(domain_cluster)
    if domain_cluster != api_cluster and node_id.startswith(prefix):
        return f"{_named(api_cluster)}{node_id[len(prefix):]}"
    return node_id


def domain_node(domain_cluster: str, api_cluster: str, node_id: str) -> str:
    """The domain id of a node named as ``api_node`` shows it (the domain id itself is
    taken too: ids shown before this mapping still work)."""
    ours, theirs = _named(domain_cluster), _named(api_cluster)
    if domain_cluster == api_cluster or node_id.startswith(ours):
        return node_id
    if node_id.startswith(theirs):
        return f"{ours}{node_id[len(theirs):]}"
    return node_id


def api_text(domain_cluster: str, api_cluster: str, text: str) -> str:
    """A line about a cluster (the timeline's) as its project reads it: its nodes and the
    cluster under the names the API gives them (``api_node``)."""
    if domain_cluster == api_cluster:
        return text
    return text.replace(_named(domain_cluster), _named(api_cluster)).replace(
        domain_cluster, api_cluster)
