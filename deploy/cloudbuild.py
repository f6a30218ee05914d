#!/usr/bin/env python3
"""Generate ``cloudbuild.yaml`` from the code's own tables, so the deployment cannot drift
from them: functions from ``services.wiring.routes.SERVICES`` (+ the API and the workflow steps),
topics from ``services.wiring.routes.families()``, push subscriptions from
``shared.adapters.pubsub.plan_subscriptions()``, workflows from ``workflows/``, indexes from
``deploy/firestore.indexes.json``.

    .venv/bin/python deploy/cloudbuild.py            # rewrite cloudbuild.yaml
    .venv/bin/python deploy/cloudbuild.py --check    # exit 1 if it is out of date
    .venv/bin/python -m deploy.cloudbuild --dry-run  # print the plan, change nothing
        [--substitutions=_PROJECT=my-project,_REGION=europe-west1]

Deploy with ``gcloud builds submit --config cloudbuild.yaml --substitutions=_REGION=...``
(the project is the build's project unless ``_PROJECT`` says otherwise).

On a fresh project it enables the APIs, creates the Firestore database (if missing), its
indexes and the TTL policies of every retention-bound collection, and looks the target
project's number up (for the Pub/Sub service agent's grants) instead of assuming the build's.

Security model: one runtime service account per function (Firestore user on the project,
publisher on the mtc topics only; the provisioning function may also start workflow
executions), one push identity allowed to invoke only the event functions, a workflow
identity and a scheduler identity allowed to invoke only the steps function; no function
allows unauthenticated calls. The compute executor (beside the machines, on the Slurm
controller; ``mtc-executor``) pulls the ordered ``mtc-compute-requests`` subscription and
publishes results to the event topics, and nothing else; only when it drives Compute Engine
(``_EXECUTOR_GCE=true``) may it manage instances (``roles/compute.instanceAdmin.v1``) and
attach the nodes' own identity (``mtc-node``: publisher on the node topic, for the agent).
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from services.api.audit import AUDIT_COLLECTION  # noqa: E402
from services.api.operations import OPERATIONS  # noqa: E402
from services.observability.alerts import ALERTS  # noqa: E402
from services.wiring.routes import SERVICES, control_plane_routes  # noqa: E402
from shared.adapters import pubsub as ps  # noqa: E402
from shared.adapters.docstore import EVENTS, PROCESSED  # noqa: E402

ROUTES = control_plane_routes()

OUT = ROOT / "cloudbuild.yaml"
INDEXES = ROOT / "deploy" / "firestore.indexes.json"
# collections that grow with every event, and the timestamp field their TTL policy reads
TTL_FIELD = "expire_at"
# every collection whose documents carry expire_at: the event log, idempotency records,
# resolved alerts, long-running operations, the audit log
TTL_COLLECTIONS = (EVENTS, PROCESSED, ALERTS, OPERATIONS, AUDIT_COLLECTION)
PROJECT = "${_PROJECT}"
REGION = "${_REGION}"
SA_DOMAIN = f"{PROJECT}.iam.gserviceaccount.com"
# the target project's number, looked up in the step (the build may run in another project)
PROJECT_NUMBER_LINE = ("project_number=$$(" + "gcloud projects describe " + PROJECT
                       + " '--format=value(projectNumber)')")
PUBSUB_AGENT = "service-$${project_number}@gcp-sa-pubsub.iam.gserviceaccount.com"
PUSH_SA = "mtc-push"
WORKFLOW_SA = "mtc-workflow"
SCHEDULER_SA = "mtc-scheduler"
EXECUTOR_SA = "mtc-executor"
NODE_SA = "mtc-node"
COMPUTE_TOPIC = ps.topic_id("compute-requests")  # ordered per node (the ordering key)
# the executor's own pull subscription (services.executor: mtc-executor-<MTC_EXECUTOR_ID>)
EXECUTOR_SUBSCRIPTION = "mtc-executor-${_EXECUTOR_ID}"
GCLOUD_IMAGE = "gcr.io/google.com/cloudsdktool/google-cloud-cli:slim"
EMULATORS_IMAGE = "gcr.io/google.com/cloudsdktool/google-cloud-cli:emulators"
PYTHON_IMAGE = "python:3.11-slim"
APIS = ("cloudfunctions.googleapis.com", "run.googleapis.com", "cloudbuild.googleapis.com",
        "artifactregistry.googleapis.com", "pubsub.googleapis.com", "firestore.googleapis.com",
        "workflows.googleapis.com", "cloudscheduler.googleapis.com", "iam.googleapis.com",
        "logging.googleapis.com", "compute.googleapis.com",
        "cloudresourcemanager.googleapis.com")

SUBSTITUTIONS = {
    "_PROJECT": "${PROJECT_ID}",
    "_REGION": "us-central1",
    "_RUNTIME": "python311",
    "_FIRESTORE_DATABASE": "(default)",
    "_FIRESTORE_LOCATION": "nam5",
    "_PROVISIONING": "workflow",
    "_COMPUTE": "remote",  # compute requests to the executor beside the machines
    "_EXECUTOR_GCE": "true",
    "_EXECUTOR_ID": "controller",
    "_ACK_DEADLINE": "60",
    "_MIN_RETRY_DELAY": "10s",
    "_MAX_RETRY_DELAY": "600s",
    "_MAX_DELIVERY_ATTEMPTS": "10",  # 10 s to 600 s apart: about 40 min (DeliverySettings.retry_budget_s)
    "_FUNCTION_TIMEOUT": "60s",
    "_MAX_INSTANCES": "20",
    "_TICK_SCHEDULE": "* * * * *",
}


def functions() -> list[tuple[str, str]]:
    """(deployed name, entry point in the root main.py) for every function."""
    return [*((ps.function_name(s), s) for s in SERVICES),
            (ps.function_name("api"), "api"), (ps.function_name("steps"), "steps")]


def workflows() -> list[Path]:
    return sorted((ROOT / "workflows").glob("*.workflows.yaml"))


def workflow_name(path: Path) -> str:
    return "mtc-" + path.name.removesuffix(".workflows.yaml").replace("_", "-")


def sa_email(account: str) -> str:
    return f"{account}@{SA_DOMAIN}"


def q(token: str) -> str:
    """Quote for bash. Tokens with substitutions (``${_X}``: Cloud Build replaces them before
    bash runs, and a value may hold spaces or parentheses) or shell variables (``$$X``) are
    double-quoted so the variable still expands; others are single-quoted when needed."""
    if "$" in token:
        return '"' + token.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if re.fullmatch(r"[A-Za-z0-9_@%+=:,./-]+", token):
        return token
    return shlex.quote(token)


def cmd(*argv: str) -> str:
    return " ".join(q(a) for a in argv)


def ensure(describe: list[str], create: list[str]) -> str:
    return f"{cmd(*describe)} >/dev/null 2>&1 || {cmd(*create)}"


def upsert(describe: list[str], update: list[str], create: list[str]) -> str:
    return (f"if {cmd(*describe)} >/dev/null 2>&1; then {cmd(*update)}; "
            f"else {cmd(*create)}; fi")


def bash_step(step_id: str, lines: list[str], *, wait_for: list[str], image: str = GCLOUD_IMAGE
              ) -> dict[str, Any]:
    return {"id": step_id, "name": image, "entrypoint": "bash",
            "args": ["-ceu", "\n".join(lines) + "\n"], "waitFor": wait_for}


def function_url(name: str) -> str:
    return "$$(" + cmd("gcloud", "functions", "describe", name, "--gen2", f"--region={REGION}",
                       f"--project={PROJECT}", "--format=value(serviceConfig.uri)") + ")"


def build() -> dict[str, Any]:
    steps: list[dict[str, Any]] = []
    fns = functions()

    steps.append(bash_step("unit-tests", [
        "pip install --quiet -c constraints.txt -e '.[dev]'",
        "ruff check shared services tests",
        "mypy shared",
        "pytest -q -m 'not integration'",
    ], wait_for=["-"], image=PYTHON_IMAGE))
    steps.append(bash_step("integration-tests", [
        "python3 -m venv .venv || (apt-get update -qq && apt-get install -y -qq python3-venv"
        " && python3 -m venv .venv)",
        ".venv/bin/pip install --quiet -c constraints.txt -e '.[dev]'",
        ".venv/bin/pytest -q -m integration tests/integration/gcp",
    ], wait_for=["-"], image=EMULATORS_IMAGE))
    steps.append(bash_step("prepare-source", [
        # the functions install the core and the gcp extra only (no simpy, no matplotlib),
        # and the in-job SDK from the source (its protocol is the control plane's too)
        "python3 -c \"import tomllib; d = tomllib.load(open('pyproject.toml', 'rb'));"
        " print('-c constraints.txt'); print(*d['project']['dependencies'],"
        " *d['project']['optional-dependencies']['gcp'], './shared/sdk', sep=chr(10))\""
        " > requirements.txt",
        "printf '#!include:.gitignore\\ntests/\\nbench/\\n.venv-wf/\\nvar/\\n'"
        " > .gcloudignore",
    ], wait_for=["unit-tests", "integration-tests"], image=PYTHON_IMAGE))

    steps.append(bash_step("enable-apis", [
        cmd("gcloud", "services", "enable", *APIS, f"--project={PROJECT}"),
    ], wait_for=["unit-tests", "integration-tests"]))

    db = "${_FIRESTORE_DATABASE}"
    steps.append(bash_step("firestore-database", [ensure(
        ["gcloud", "firestore", "databases", "describe", f"--database={db}",
         f"--project={PROJECT}"],
        ["gcloud", "firestore", "databases", "create", f"--database={db}",
         "--location=${_FIRESTORE_LOCATION}", "--type=firestore-native",
         f"--project={PROJECT}"])], wait_for=["enable-apis"]))

    accounts = [name for name, _ in fns] + [PUSH_SA, WORKFLOW_SA, SCHEDULER_SA, EXECUTOR_SA,
                                            NODE_SA]
    lines = []
    for account in accounts:
        lines.append(ensure(
            ["gcloud", "iam", "service-accounts", "describe", sa_email(account),
             f"--project={PROJECT}"],
            ["gcloud", "iam", "service-accounts", "create", account, f"--project={PROJECT}",
             f"--display-name=mtc {account}"]))
    # Firestore has no finer grant than the database's project (the executor writes its
    # liveness document, executors/<id>)
    for name in [*(n for n, _ in fns), EXECUTOR_SA]:
        lines.append(cmd("gcloud", "projects", "add-iam-policy-binding", PROJECT,
                         f"--member=serviceAccount:{sa_email(name)}",
                         "--role=roles/datastore.user", "--condition=None"))
    lines.append(cmd("gcloud", "projects", "add-iam-policy-binding", PROJECT,
                     f"--member=serviceAccount:{sa_email(WORKFLOW_SA)}",
                     "--role=roles/logging.logWriter", "--condition=None"))
    lines.append(cmd("gcloud", "projects", "add-iam-policy-binding", PROJECT,
                     f"--member=serviceAccount:{sa_email(ps.function_name('provisioning'))}",
                     "--role=roles/workflows.invoker", "--condition=None"))
    # the executor manages instances only where it drives Compute Engine, and may attach
    # only the nodes' identity to them
    lines.append('if [ "${_EXECUTOR_GCE}" = true ]; then '
                 + cmd("gcloud", "projects", "add-iam-policy-binding", PROJECT,
                       f"--member=serviceAccount:{sa_email(EXECUTOR_SA)}",
                       "--role=roles/compute.instanceAdmin.v1", "--condition=None")
                 + "; " + cmd("gcloud", "iam", "service-accounts", "add-iam-policy-binding",
                              sa_email(NODE_SA), f"--project={PROJECT}",
                              f"--member=serviceAccount:{sa_email(EXECUTOR_SA)}",
                              "--role=roles/iam.serviceAccountUser") + "; fi")
    steps.append(bash_step("service-accounts", lines, wait_for=["enable-apis"]))

    event_topics = sorted({*ps.topics(ROUTES), ps.alerts_topic_id()})
    topic_ids = [*event_topics, COMPUTE_TOPIC, ps.dead_letter_topic_id()]
    lines = [PROJECT_NUMBER_LINE]
    for topic in topic_ids:
        lines.append(ensure(["gcloud", "pubsub", "topics", "describe", topic,
                             f"--project={PROJECT}"],
                            ["gcloud", "pubsub", "topics", "create", topic,
                             f"--project={PROJECT}"]))
        # every function may emit events of any family and ask compute for anything; the
        # executor publishes what the machines did (events) and the requests it refuses
        # (dead letters), never compute requests
        publishers = ([EXECUTOR_SA] if topic == ps.dead_letter_topic_id() else
                      [name for name, _ in fns] + ([EXECUTOR_SA] if topic in event_topics else []))
        for name in publishers:
            lines.append(cmd("gcloud", "pubsub", "topics", "add-iam-policy-binding", topic,
                             f"--project={PROJECT}",
                             f"--member=serviceAccount:{sa_email(name)}",
                             "--role=roles/pubsub.publisher"))
    lines.append(cmd("gcloud", "pubsub", "topics", "add-iam-policy-binding", ps.topic_id("node"),
                     f"--project={PROJECT}", f"--member=serviceAccount:{sa_email(NODE_SA)}",
                     "--role=roles/pubsub.publisher"))  # the node agent's health reports
    dead = ps.dead_letter_topic_id()
    lines.append(cmd("gcloud", "pubsub", "topics", "add-iam-policy-binding", dead,
                     f"--project={PROJECT}", f"--member=serviceAccount:{PUBSUB_AGENT}",
                     "--role=roles/pubsub.publisher"))
    lines.append(ensure(
        ["gcloud", "pubsub", "subscriptions", "describe", ps.dead_letter_subscription_id(),
         f"--project={PROJECT}"],
        ["gcloud", "pubsub", "subscriptions", "create", ps.dead_letter_subscription_id(),
         f"--project={PROJECT}", f"--topic={dead}", "--message-retention-duration=7d",
         "--expiration-period=never"]))
    # the executor's pull subscription: ordered (requests about one node keep their order)
    lines.append(ensure(
        ["gcloud", "pubsub", "subscriptions", "describe", EXECUTOR_SUBSCRIPTION,
         f"--project={PROJECT}"],
        ["gcloud", "pubsub", "subscriptions", "create", EXECUTOR_SUBSCRIPTION,
         f"--project={PROJECT}", f"--topic={COMPUTE_TOPIC}", "--enable-message-ordering",
         "--ack-deadline=${_ACK_DEADLINE}", "--min-retry-delay=${_MIN_RETRY_DELAY}",
         "--max-retry-delay=${_MAX_RETRY_DELAY}", f"--dead-letter-topic={dead}",
         "--max-delivery-attempts=${_MAX_DELIVERY_ATTEMPTS}",
         "--message-retention-duration=7d", "--expiration-period=never"]))
    for member in (f"serviceAccount:{sa_email(EXECUTOR_SA)}", f"serviceAccount:{PUBSUB_AGENT}"):
        lines.append(cmd("gcloud", "pubsub", "subscriptions", "add-iam-policy-binding",
                         EXECUTOR_SUBSCRIPTION, f"--project={PROJECT}", f"--member={member}",
                         "--role=roles/pubsub.subscriber"))
    steps.append(bash_step("topics", lines, wait_for=["service-accounts"]))

    deploy_ids = []
    for name, entry in fns:
        env = ("MTC_BACKEND=gcp,GOOGLE_CLOUD_PROJECT=" + PROJECT + ",MTC_COMPUTE=${_COMPUTE}"
               ",MTC_PROVISIONING=${_PROVISIONING},MTC_WORKFLOW_LOCATION=" + REGION)
        step_id = f"deploy-{name}"
        deploy_ids.append(step_id)
        steps.append(bash_step(step_id, [cmd(
            "gcloud", "functions", "deploy", name, "--gen2", f"--region={REGION}",
            f"--project={PROJECT}", "--runtime=${_RUNTIME}", "--source=.",
            f"--entry-point={entry}", "--trigger-http", "--no-allow-unauthenticated",
            f"--service-account={sa_email(name)}", f"--set-env-vars={env}",
            "--timeout=${_FUNCTION_TIMEOUT}", "--max-instances=${_MAX_INSTANCES}",
            "--memory=512Mi")], wait_for=["prepare-source", "topics", "firestore-database"]))

    lines = [PROJECT_NUMBER_LINE]
    services = sorted({p.service for p in ps.plan_subscriptions(ROUTES)})
    for service in services:
        name = ps.function_name(service)
        lines.append(cmd("gcloud", "functions", "add-invoker-policy-binding", name,
                         f"--region={REGION}", f"--project={PROJECT}",
                         f"--member=serviceAccount:{sa_email(PUSH_SA)}"))
    for plan in ps.plan_subscriptions(ROUTES):
        var = "URL_" + re.sub(r"\W", "_", plan.service).upper()
        lines.append(f"{var}={function_url(ps.function_name(plan.service))}")
        common = [f"--project={PROJECT}", f"--push-endpoint=$${var}",
                  f"--push-auth-service-account={sa_email(PUSH_SA)}",
                  "--ack-deadline=${_ACK_DEADLINE}", "--min-retry-delay=${_MIN_RETRY_DELAY}",
                  "--max-retry-delay=${_MAX_RETRY_DELAY}", f"--dead-letter-topic={dead}",
                  "--max-delivery-attempts=${_MAX_DELIVERY_ATTEMPTS}"]
        create = ["gcloud", "pubsub", "subscriptions", "create", plan.name,
                  f"--topic={plan.topic}", *common, "--expiration-period=never"]
        if plan.filter:  # immutable once created; the functions ignore other types anyway
            create.append(f"--message-filter={plan.filter}")
        lines.append(upsert(
            ["gcloud", "pubsub", "subscriptions", "describe", plan.name, f"--project={PROJECT}"],
            ["gcloud", "pubsub", "subscriptions", "update", plan.name, *common], create))
        lines.append(cmd("gcloud", "pubsub", "subscriptions", "add-iam-policy-binding",
                         plan.name, f"--project={PROJECT}",
                         f"--member=serviceAccount:{PUBSUB_AGENT}",
                         "--role=roles/pubsub.subscriber"))
    steps.append(bash_step("subscriptions", lines, wait_for=deploy_ids))

    steps_fn = ps.function_name("steps")
    lines = [f"STEPS_URL={function_url(steps_fn)}"]
    for account in (WORKFLOW_SA, SCHEDULER_SA):
        lines.append(cmd("gcloud", "functions", "add-invoker-policy-binding", steps_fn,
                         f"--region={REGION}", f"--project={PROJECT}",
                         f"--member=serviceAccount:{sa_email(account)}"))
    for path in workflows():
        lines.append(cmd("gcloud", "workflows", "deploy", workflow_name(path),
                         f"--source={path.relative_to(ROOT)}", f"--location={REGION}",
                         f"--project={PROJECT}", f"--service-account={sa_email(WORKFLOW_SA)}",
                         "--set-env-vars=MTC_STEPS_URL=$$STEPS_URL"))
    steps.append(bash_step("workflows", lines, wait_for=deploy_ids))

    tick = ["--location=" + REGION, f"--project={PROJECT}", "--schedule=${_TICK_SCHEDULE}",
            "--uri=$$STEPS_URL/tick", "--http-method=POST",
            f"--oidc-service-account-email={sa_email(SCHEDULER_SA)}", "--message-body={}",
            "--headers=Content-Type=application/json"]
    steps.append(bash_step("scheduler", [
        f"STEPS_URL={function_url(steps_fn)}",
        upsert(["gcloud", "scheduler", "jobs", "describe", "mtc-tick", f"--location={REGION}",
                f"--project={PROJECT}"],
               ["gcloud", "scheduler", "jobs", "update", "http", "mtc-tick", *tick],
               ["gcloud", "scheduler", "jobs", "create", "http", "mtc-tick", *tick]),
    ], wait_for=["workflows"]))

    index_lines = []
    for index in json.loads(INDEXES.read_text())["indexes"]:
        fields = [f"--field-config=field-path={f['fieldPath']},order={f['order'].lower()}"
                  for f in index["fields"]]
        create_index = cmd("gcloud", "firestore", "indexes", "composite", "create",
                     f"--collection-group={index['collectionGroup']}",
                     f"--query-scope={index.get('queryScope', 'COLLECTION')}",
                     "--database=${_FIRESTORE_DATABASE}", f"--project={PROJECT}", *fields,
                     "--async")
        # an index that exists already is fine; any other failure fails the build
        index_lines.append(
            f'OUT=$$({create_index} 2>&1) || {{ echo "$$OUT"; grep -q ALREADY_EXISTS <<<"$$OUT"; }}')
    steps.append(bash_step("firestore-indexes", index_lines, wait_for=["firestore-database"]))

    # retention: Firestore deletes a document of these collections once its expire_at (a
    # timestamp the store writes) has passed; see ControlPlaneConfig.retention_s
    ttl_lines = [cmd("gcloud", "firestore", "fields", "ttls", "update", TTL_FIELD,
                     f"--collection-group={group}", "--enable-ttl",
                     "--database=${_FIRESTORE_DATABASE}", f"--project={PROJECT}", "--async")
                 for group in TTL_COLLECTIONS]
    steps.append(bash_step("firestore-ttls", ttl_lines, wait_for=["firestore-database"]))

    return {
        "substitutions": SUBSTITUTIONS,
        "options": {"dynamicSubstitutions": True, "logging": "CLOUD_LOGGING_ONLY"},
        "timeout": "3600s",
        "steps": steps,
    }


HEADER = """\
# Generated by deploy/cloudbuild.py from the code's own tables; do not edit by hand.
# Tests (unit, then integration against the Pub/Sub and Firestore emulators), then deploys
# every function (gen2, HTTP, invoked by Pub/Sub push), the topics, one push subscription per
# (service, event family) with a dead-letter policy, the workflows, the tick schedule and the
# Firestore indexes and TTL policies to the project in _PROJECT (default: the build's project):
#   gcloud builds submit --config cloudbuild.yaml --substitutions=_REGION=europe-west1
"""


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def render() -> str:
    return HEADER + yaml.dump(build(), Dumper=_Dumper, sort_keys=False, width=4096,
                              allow_unicode=True)


def plan(build_: dict[str, Any], overrides: dict[str, str]) -> str:
    """What the build would do, step by step, with its substitutions filled in: the
    defaults, then ``overrides`` (``_PROJECT``, ``_REGION``...; ``PROJECT_ID`` is the build's)."""
    values = {"PROJECT_ID": "<build project>", **build_["substitutions"], **overrides}
    for _ in range(3):  # defaults may name others (_PROJECT: ${PROJECT_ID})
        values = {k: _fill(v, values) for k, v in values.items()}
    out = [f"Deployment plan: {len(build_['steps'])} steps to project {values['_PROJECT']}"
           f", region {values['_REGION']} (nothing is changed by a dry run)"]
    for i, step in enumerate(build_["steps"], 1):
        after = ", ".join(w for w in step["waitFor"] if w != "-") or "start"
        out.append(f"\n[{i}] {step['id']}  (after: {after})")
        script = _fill(step["args"][1], values).replace("$$", "$")
        out.extend("    " + line for line in script.splitlines())
    return "\n".join(out) + "\n"


def _fill(text: str, values: dict[str, str]) -> str:
    """``${NAME}`` (not ``$${name}``, a shell variable) replaced by its value."""
    return re.sub(r"(?<!\$)\$\{(\w+)\}", lambda m: values.get(m[1], m[0]), text)


def _overrides(argv: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for arg in argv:
        if arg.startswith("--substitutions="):
            for pair in filter(None, arg.split("=", 1)[1].split(",")):
                key, eq, value = pair.partition("=")
                if not eq or not key.startswith("_") or key not in SUBSTITUTIONS:
                    raise SystemExit(f"--substitutions: unknown or malformed {pair!r}"
                                     f" (known: {', '.join(SUBSTITUTIONS)})")
                out[key] = value
    return out


def main(argv: list[str]) -> int:
    if "--dry-run" in argv:
        sys.stdout.write(plan(build(), _overrides(argv)))
        return 0
    text = render()
    if "--check" in argv:
        if OUT.read_text() != text:
            print("cloudbuild.yaml is out of date: run deploy/cloudbuild.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
