"""Cloud Storage buckets belong to projects: the first project to name a bucket owns it.

A ``gs://BUCKET/PATH`` is a directory of the deployment's output root (``<output
root>/gcs/BUCKET/PATH``), which every project's jobs would otherwise share: one project's
job could read another's model weights by naming them. So the first create that names a
bucket (a job's ``baseOutputDirectory`` or ``packageUris``, a model's ``artifactUri``, the
same fields in a pipeline or a tuning job) records its project as the owner, in the same
transaction as the create; a create from another project that names the bucket is refused
with PERMISSION_DENIED naming the URI and its field, and writes nothing. Ownership never
lapses (the records are one per bucket). The sandbox then binds a job's package files from
the buckets its own spec names only (``shared.service_layer.gangs.buckets``).

Cloud Storage's own calls (``services.api.storage``) use the same owners: a bucket insert
(``create``) claims a bucket no project has, and every object call is authorized against the
owner's project (``owner``). A package URI must name an object of the tree
(``check_packages``), checked at create.

A state directory that already holds records when ownership is first needed gets its owners
from them once, oldest first (``_adopt``): a bucket a project used before is its own, not
the next project's to take.

The bucket is read as the output and package paths read it (``shared.service_layer.pool_commands``):
``gs://a//../b/x`` names the directory of bucket ``b``, so it is ``b`` that is checked.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from services.api import ids
from services.api.context import RESOURCES
from services.api.errors import ApiError, FieldViolation, invalid
from services.api.names import Parent
from services.api.storage_files import Tree
from services.pipelines.registry import VERSIONS
from shared.service_layer.pool_commands import gcs_bucket

BUCKETS = "api_buckets"  # {project, time}, one per bucket, keyed by its name
ADOPTED = "buckets"  # the record (in ids.TENANCY) saying the existing records were read
Named = tuple[str, str]  # (field path, URI)
_URI_FIELDS = ("outputUriPrefix", "packageUris", "artifactUri")  # what job_uris reads


def job_uris(job_spec: dict[str, Any] | None, where: str) -> list[Named]:
    """The URIs a CustomJobSpec's wire form (at ``where``) names buckets in."""
    spec = job_spec or {}
    out: list[Named] = []
    base = (spec.get("baseOutputDirectory") or {}).get("outputUriPrefix")
    if base:
        out.append((f"{where}.baseOutputDirectory.outputUriPrefix", base))
    for i, pool in enumerate(spec.get("workerPoolSpecs") or []):
        package = pool.get("pythonPackageSpec") or {}
        out += [(f"{where}.workerPoolSpecs[{i}].pythonPackageSpec.packageUris[{j}]", uri)
                for j, uri in enumerate(package.get("packageUris") or [])]
    return out


def claim(uow: Any, parent: Parent, named: Iterable[Named], now: float) -> None:
    """The buckets ``named`` are ``parent``'s project's: one another project owns is refused
    (nothing is written, the first such URI named); the others are recorded as its own."""
    if uow.record(ids.TENANCY, ADOPTED) is None:
        _adopt(uow, now)
    new: list[str] = []
    for field, uri in named:
        bucket = gcs_bucket(uri)
        if bucket is None:
            continue
        owner = uow.record(BUCKETS, bucket)
        if owner is not None and owner["project"] != parent.project:
            why = (f"{uri} is in bucket {bucket}, which belongs to another project: use a "
                   "bucket of this project")
            raise ApiError("PERMISSION_DENIED", f"{field}: {why}", [FieldViolation(field, why)])
        if owner is None and bucket not in new:
            new.append(bucket)
    for bucket in new:
        uow.put_record(BUCKETS, bucket, {"project": parent.project, "time": now})


def check_packages(root: Path | None, named: Iterable[Named]) -> None:
    """Each ``packageUris`` entry is an object of ``root``'s ``gcs/`` tree (a 400 naming its
    field else): a missing package fails at create, not later as the program's fault, and a
    path on the server's host is no package URI (a job would read the server's files).
    ``root`` None: ``gs://`` is Google's Cloud Storage, not checked here."""
    if root is None:
        return
    tree = Tree(root)
    for field, uri in named:
        if ".packageUris[" not in field:
            continue
        if not uri.startswith("gs://"):
            raise invalid(field, f"{uri!r} is not a Cloud Storage URI: upload the package "
                          "(google-cloud-storage with STORAGE_EMULATOR_HOST, `mtc serve` "
                          "prints it) and name it gs://BUCKET/OBJECT")
        parts = [p for p in uri.removeprefix("gs://").split("/") if p not in ("", ".", "..")]
        try:
            if len(parts) < 2:
                raise FileNotFoundError(uri)
            tree.stat(parts[0], "/".join(parts[1:]))
        except FileNotFoundError:
            raise invalid(field, f"{uri} does not exist: upload it first") from None
        except ApiError as exc:  # a name the tree refuses
            raise invalid(field, f"{uri} names no object: {exc.message}") from None


def owner(uow: Any, bucket: str) -> str | None:
    """The project that owns ``bucket``; None: no project has it. Read only: before the
    first claim, from the records as ``_adopt`` will read them."""
    if uow.record(ids.TENANCY, ADOPTED) is None:
        return _found_owners(uow).get(bucket)
    record = uow.record(BUCKETS, bucket)
    return None if record is None else str(record["project"])


def owned_by(uow: Any, project: str) -> list[str]:
    """The buckets ``project`` owns, by name."""
    if uow.record(ids.TENANCY, ADOPTED) is None:
        return sorted(b for b, p in _found_owners(uow).items() if p == project)
    return sorted(str(r["_id"]) for r in uow.records(BUCKETS, {"project": project}))


def create(uow: Any, project: str, bucket: str, now: float) -> bool:
    """Make ``bucket`` ``project``'s; False: some project already owns it (nothing written)."""
    if uow.record(ids.TENANCY, ADOPTED) is None:
        _adopt(uow, now)
    if uow.record(BUCKETS, bucket) is not None:
        return False
    uow.put_record(BUCKETS, bucket, {"project": project, "time": now})
    return True


def _adopt(uow: Any, now: float) -> None:
    """Owners from the records already stored (jobs, tuning jobs, pipelines, model versions),
    the oldest use of each bucket first; once per deployment, in the first create that
    names a bucket (every claim comes after it: no bucket has an owner yet)."""
    for bucket, project in _found_owners(uow).items():
        uow.put_record(BUCKETS, bucket, {"project": project, "time": now})
    uow.put_record(ids.TENANCY, ADOPTED, {"time": now})


def _found_owners(uow: Any) -> dict[str, str]:
    found: list[tuple[float, str, str]] = []  # (created, project, bucket)
    for collection in (RESOURCES, VERSIONS):
        for record in uow.records(collection, {}):
            body = record.get("resource", record.get("model"))
            found += [(float(record.get("created", 0)), _project_of(record), b)
                      for b in sorted(_named_in(body))]
    owners: dict[str, str] = {}
    for _, project, bucket in sorted(found):
        if project:
            owners.setdefault(bucket, project)
    return owners


def _project_of(record: dict[str, Any]) -> str:
    """An API record's project (a model version's, from its ``projects/P/...`` parent)."""
    if record.get("project"):
        return str(record["project"])
    parts = str(record.get("parent", "")).split("/")
    return parts[1] if len(parts) > 1 and parts[0] == "projects" else ""


def _named_in(body: Any) -> set[str]:
    """The buckets a stored body names in the fields ``job_uris`` and uploads read."""
    out: set[str] = set()
    if isinstance(body, dict):
        for key, value in body.items():
            values = value if isinstance(value, list) else [value]
            if key in _URI_FIELDS:
                out.update(b for v in values if isinstance(v, str) and (b := gcs_bucket(v)))
            else:
                for v in values:
                    out |= _named_in(v)
    return out
