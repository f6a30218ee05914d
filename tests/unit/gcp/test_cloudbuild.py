"""cloudbuild.yaml deploys every function, topic, subscription, workflow and index in the
repository, with well-formed gcloud commands, after the tests."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.wiring.routes import SERVICES, control_plane_routes, families
from shared.adapters import pubsub as ps

ROUTES = control_plane_routes()

ROOT = Path(__file__).resolve().parents[3]
CLOUDBUILD = ROOT / "cloudbuild.yaml"

# The flags each gcloud command may take here (from the gcloud reference), so a typo or a
# flag of another command fails the test instead of the deployment.
ALLOWED: dict[tuple[str, ...], set[str]] = {
    ("services", "enable"): {"--project"},
    ("iam", "service-accounts", "describe"): {"--project"},
    ("iam", "service-accounts", "create"): {"--project", "--display-name", "--description"},
    ("projects", "add-iam-policy-binding"): {"--member", "--role", "--condition"},
    ("projects", "describe"): {"--format"},
    ("iam", "service-accounts", "add-iam-policy-binding"): {"--project", "--member", "--role"},
    ("firestore", "databases", "describe"): {"--database", "--project"},
    ("firestore", "databases", "create"): {"--database", "--location", "--type", "--project"},
    ("pubsub", "topics", "describe"): {"--project"},
    ("pubsub", "topics", "create"): {"--project", "--message-retention-duration"},
    ("pubsub", "topics", "add-iam-policy-binding"): {"--project", "--member", "--role"},
    ("pubsub", "subscriptions", "describe"): {"--project"},
    ("pubsub", "subscriptions", "create"): {
        "--project", "--topic", "--push-endpoint", "--push-auth-service-account",
        "--ack-deadline", "--min-retry-delay", "--max-retry-delay", "--dead-letter-topic",
        "--max-delivery-attempts", "--message-filter", "--expiration-period",
        "--message-retention-duration", "--enable-message-ordering"},
    ("pubsub", "subscriptions", "update"): {
        "--project", "--push-endpoint", "--push-auth-service-account", "--ack-deadline",
        "--min-retry-delay", "--max-retry-delay", "--dead-letter-topic",
        "--max-delivery-attempts", "--expiration-period", "--message-retention-duration"},
    ("pubsub", "subscriptions", "add-iam-policy-binding"): {"--project", "--member", "--role"},
    ("functions", "deploy"): {
        "--gen2", "--region", "--project", "--runtime", "--source", "--entry-point",
        "--trigger-http", "--no-allow-unauthenticated", "--service-account",
        "--set-env-vars", "--timeout", "--max-instances", "--min-instances", "--memory",
        "--cpu", "--concurrency", "--ingress-settings"},
    ("functions", "describe"): {"--gen2", "--region", "--project", "--format"},
    ("functions", "add-invoker-policy-binding"): {"--region", "--project", "--member"},
    ("workflows", "deploy"): {"--source", "--location", "--project", "--service-account",
                              "--set-env-vars", "--description"},
    ("scheduler", "jobs", "describe"): {"--location", "--project"},
    ("scheduler", "jobs", "create", "http"): {
        "--location", "--project", "--schedule", "--uri", "--http-method",
        "--oidc-service-account-email", "--oidc-token-audience", "--message-body", "--headers",
        "--time-zone"},
    ("scheduler", "jobs", "update", "http"): {
        "--location", "--project", "--schedule", "--uri", "--http-method",
        "--oidc-service-account-email", "--oidc-token-audience", "--message-body",
        "--update-headers", "--headers", "--time-zone"},
    ("firestore", "indexes", "composite", "create"): {
        "--collection-group", "--query-scope", "--database", "--project", "--field-config",
        "--async"},
    ("firestore", "fields", "ttls", "update"): {
        "--collection-group", "--enable-ttl", "--database", "--project", "--async"},
}
VALUELESS = {"--gen2", "--trigger-http", "--no-allow-unauthenticated", "--async", "--enable-ttl",
             "--enable-message-ordering"}


def load() -> dict[str, Any]:
    return yaml.safe_load(CLOUDBUILD.read_text())  # type: ignore[no-any-return]


def scripts(build: dict[str, Any]) -> dict[str, str]:
    out = {}
    for step in build["steps"]:
        assert step["entrypoint"] == "bash" and step["args"][0] == "-ceu", step["id"]
        out[step["id"]] = step["args"][1]
    return out


def commands(script: str) -> list[list[str]]:
    """Every gcloud invocation in a bash script (inside $(...), after ||, in if/then...)."""
    found = []
    for line in script.splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        tokens = list(lexer)
        i = 0
        while i < len(tokens):
            assigned = (tokens[i].endswith("=$$") and i + 2 < len(tokens)
                        and tokens[i + 2] == "gcloud")  # X=$$(gcloud ...)
            if tokens[i] == "gcloud" or assigned:
                start = i if tokens[i] == "gcloud" else i + 2
                j = start + 1
                while j < len(tokens) and not re.fullmatch(r"[();<>|&]+", tokens[j]):
                    j += 1
                argv = tokens[start:j]
                if argv and argv[-1].isdigit():  # the 2 of 2>&1
                    argv = argv[:-1]
                found.append(argv[1:])
                i = j
            else:
                i += 1
    return found


def split(argv: list[str]) -> tuple[tuple[str, ...], list[str], list[str]]:
    """(command path, positionals, flags) of one gcloud invocation."""
    for n in (4, 3, 2):
        if tuple(argv[:n]) in ALLOWED:
            rest = argv[n:]
            return tuple(argv[:n]), [a for a in rest if not a.startswith("--")], \
                [a for a in rest if a.startswith("--")]
    raise AssertionError(f"unexpected gcloud command: gcloud {' '.join(argv)}")


@pytest.fixture(scope="module")
def build() -> dict[str, Any]:
    return load()


@pytest.fixture(scope="module")
def gcloud(build: dict[str, Any]) -> list[tuple[str, tuple[str, ...], list[str], list[str]]]:
    out = []
    for step_id, script in scripts(build).items():
        for argv in commands(script):
            path, positionals, flags = split(argv)
            out.append((step_id, path, positionals, flags))
    return out


def flag(flags: list[str], name: str) -> str | None:
    values = [f.split("=", 1)[1] for f in flags if f.startswith(name + "=")]
    return values[0] if values else None


def test_cloudbuild_is_generated_from_the_code() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "deploy" / "cloudbuild.py"), "--check"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_every_gcloud_command_is_well_formed(gcloud: Any) -> None:
    assert gcloud
    for step_id, path, positionals, flags in gcloud:
        allowed = ALLOWED[path]
        for f in flags:
            name, eq, value = f.partition("=")
            assert name in allowed, f"{step_id}: gcloud {' '.join(path)} does not take {name}"
            if name in VALUELESS:
                assert not eq, f"{step_id}: {name} takes no value"
            else:
                assert eq and value, f"{step_id}: {name} needs a value (--flag=value)"
        expected = 0 if path in (("firestore", "indexes", "composite", "create"),
                                 ("firestore", "databases", "describe"),
                                 ("firestore", "databases", "create")) else 1
        if path == ("services", "enable"):
            assert all(p.endswith(".googleapis.com") for p in positionals)
        else:
            assert len(positionals) == expected, f"{step_id}: gcloud {' '.join(path)} " \
                                                 f"{positionals}"
        if path[0] != "projects":
            assert flag(flags, "--project") == "${_PROJECT}", f"{step_id}: {path} project"


def test_scripts_are_valid_bash_after_substitution(build: dict[str, Any]) -> None:
    values = {**build["substitutions"], "_PROJECT": "my-project", "PROJECT_NUMBER": "123"}
    for step_id, script in scripts(build).items():
        for key, value in values.items():
            script = script.replace("${" + key + "}", value)
        leftover = re.findall(r"\$\{_?[A-Z_]+\}", script)
        assert not leftover, f"{step_id}: undefined substitutions {leftover}"
        script = script.replace("$$", "$")
        proc = subprocess.run(["bash", "-n", "-c", script], capture_output=True, text=True)
        assert proc.returncode == 0, f"{step_id}: {proc.stderr}"


def test_tests_run_before_anything_is_deployed(build: dict[str, Any]) -> None:
    ids = [s["id"] for s in build["steps"]]
    assert ids[:2] == ["unit-tests", "integration-tests"]
    done: set[str] = set()
    for step in build["steps"]:
        waits = step.get("waitFor", [])
        assert all(w == "-" or w in done for w in waits), f"{step['id']} waits on a later step"
        if step["id"] not in ("unit-tests", "integration-tests"):
            closure = _ancestors(build, step["id"])
            assert {"unit-tests", "integration-tests"} <= closure, step["id"]
        done.add(step["id"])
    assert "pytest" in scripts(build)["unit-tests"]
    assert "-m integration" in scripts(build)["integration-tests"]


def _ancestors(build: dict[str, Any], step_id: str) -> set[str]:
    by_id = {s["id"]: s for s in build["steps"]}
    out: set[str] = set()
    todo = [w for w in by_id[step_id].get("waitFor", []) if w != "-"]
    while todo:
        w = todo.pop()
        if w not in out:
            out.add(w)
            todo.extend(x for x in by_id[w].get("waitFor", []) if x != "-")
    return out


def test_every_function_is_deployed_gen2_private_with_its_own_account(gcloud: Any) -> None:
    from tests.unit.gcp.test_gcp_adapters import root_main

    entry = root_main()

    deploys = {p[0]: f for _, path, p, f in gcloud if path == ("functions", "deploy")}
    expected = {ps.function_name(s): s for s in (*SERVICES, "api", "steps")}
    assert set(deploys) == set(expected)
    accounts = set()
    for name, flags in deploys.items():
        entry_point = flag(flags, "--entry-point")
        assert entry_point == expected[name]
        assert entry_point in entry.ENTRY_POINTS and callable(getattr(entry, entry_point))
        assert "--gen2" in flags and "--trigger-http" in flags
        assert "--no-allow-unauthenticated" in flags
        assert flag(flags, "--source") == "."
        assert flag(flags, "--region") == "${_REGION}"
        assert flag(flags, "--runtime") == "${_RUNTIME}"
        env = dict(kv.split("=", 1) for kv in (flag(flags, "--set-env-vars") or "").split(","))
        assert env["MTC_BACKEND"] == "gcp" and env["GOOGLE_CLOUD_PROJECT"] == "${_PROJECT}"
        account = flag(flags, "--service-account")
        assert account == f"{name}@${{_PROJECT}}.iam.gserviceaccount.com"
        accounts.add(account)
    assert len(accounts) == len(deploys)  # one service account per function


def test_service_accounts_are_created_and_least_privilege(gcloud: Any) -> None:
    created = {p[0] for _, path, p, _ in gcloud if path == ("iam", "service-accounts", "create")}
    for s in (*SERVICES, "api", "steps"):
        assert ps.function_name(s) in created
    project_roles = {(flag(f, "--member"), flag(f, "--role")) for _, path, _, f in gcloud
                     if path == ("projects", "add-iam-policy-binding")}
    executor = "serviceAccount:mtc-executor@${_PROJECT}.iam.gserviceaccount.com"
    provisioning = f"serviceAccount:{ps.function_name('provisioning')}@${{_PROJECT}}" \
                   ".iam.gserviceaccount.com"
    assert {r for _, r in project_roles} <= {"roles/datastore.user", "roles/logging.logWriter",
                                             "roles/workflows.invoker",
                                             "roles/compute.instanceAdmin.v1"}
    # only the provisioning function starts workflows; only the executor manages instances
    assert {m for m, r in project_roles if r == "roles/workflows.invoker"} == {provisioning}
    assert {m for m, r in project_roles if r == "roles/compute.instanceAdmin.v1"} == {executor}
    assert {r for m, r in project_roles if m == executor} == {
        "roles/datastore.user", "roles/compute.instanceAdmin.v1"}  # its liveness document
    assert not any(r in ("roles/owner", "roles/editor", "roles/iam.serviceAccountAdmin")
                   for _, _, _, f in gcloud for r in [flag(f, "--role")])
    invokers = {(p[0], flag(f, "--member")) for _, path, p, f in gcloud
                if path == ("functions", "add-invoker-policy-binding")}
    push = "serviceAccount:mtc-push@${_PROJECT}.iam.gserviceaccount.com"
    for s in SERVICES:
        if any(p.service == s for p in ps.plan_subscriptions(ROUTES)):
            assert (ps.function_name(s), push) in invokers
    assert (ps.function_name("api"), push) not in invokers
    steps_invokers = {m for fn, m in invokers if fn == ps.function_name("steps")}
    assert steps_invokers == {
        "serviceAccount:mtc-workflow@${_PROJECT}.iam.gserviceaccount.com",
        "serviceAccount:mtc-scheduler@${_PROJECT}.iam.gserviceaccount.com"}


def test_every_topic_and_the_dead_letter_topic_are_created(gcloud: Any) -> None:
    created = {p[0] for _, path, p, _ in gcloud if path == ("pubsub", "topics", "create")}
    assert created == {ps.topic_id(f) for f in families()} | {
        ps.dead_letter_topic_id(), ps.alerts_topic_id(), "mtc-compute-requests"}
    assert ps.alerts_topic_id() == "mtc-alerts"  # people subscribe to it; no service does


def test_every_subscription_pushes_to_its_function_with_a_dead_letter_policy(
        gcloud: Any) -> None:
    creates = {p[0]: f for _, path, p, f in gcloud
               if path == ("pubsub", "subscriptions", "create")}
    updates = {p[0]: f for _, path, p, f in gcloud
               if path == ("pubsub", "subscriptions", "update")}
    plans = ps.plan_subscriptions(ROUTES)
    assert {p.service for p in plans} == set(SERVICES)
    assert {(p.service, p.family) for p in plans} == {
        (s, f) for f, services in families().items() for s in services}
    for plan in plans:
        for flags in (creates[plan.name], updates[plan.name]):
            assert flag(flags, "--dead-letter-topic") == ps.dead_letter_topic_id()
            assert flag(flags, "--max-delivery-attempts") == "${_MAX_DELIVERY_ATTEMPTS}"
            assert flag(flags, "--ack-deadline") == "${_ACK_DEADLINE}"
            assert flag(flags, "--min-retry-delay") and flag(flags, "--max-retry-delay")
            endpoint = flag(flags, "--push-endpoint") or ""
            assert endpoint.startswith("$$URL_" + plan.service.upper())
        assert flag(creates[plan.name], "--topic") == plan.topic
        if plan.filter:
            assert flag(creates[plan.name], "--message-filter") == plan.filter
    assert ps.dead_letter_subscription_id() in creates


def test_transient_failures_are_retried_for_half_an_hour_before_a_dead_letter(
        build: dict[str, Any]) -> None:
    """Only transient failures are redelivered (permanent ones are acknowledged), so the
    attempts must outlast a contention storm: 5 attempts 10-600 s apart were 150 s."""
    subs = build["substitutions"]
    deployed = ps.DeliverySettings(
        min_backoff_s=float(subs["_MIN_RETRY_DELAY"].removesuffix("s")),
        max_backoff_s=float(subs["_MAX_RETRY_DELAY"].removesuffix("s")),
        max_delivery_attempts=int(subs["_MAX_DELIVERY_ATTEMPTS"]))
    assert deployed.retry_budget_s() >= 30 * 60, deployed


def test_the_stack_and_the_default_outlast_the_emulators_lock_storms() -> None:
    """A loaded CI run's Firestore emulator answered "Transaction lock timeout" to three
    functions for 65 s; the stack's 5 attempts (7.5 s of backoff) dead-lettered a job's exit
    and the job never ended."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import stack
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    settings = stack.Stack(state_dir=Path("unused")).delivery
    assert settings.retry_budget_s() >= 120, settings
    assert ps.DeliverySettings().retry_budget_s() >= 10 * 60
    lost_the_exit = ps.DeliverySettings(max_delivery_attempts=5, min_backoff_s=0.5,
                                        max_backoff_s=10)
    assert lost_the_exit.retry_budget_s() == 7.5


def test_push_urls_are_the_functions_urls(build: dict[str, Any]) -> None:
    script = scripts(build)["subscriptions"]
    for service in SERVICES:
        var = "URL_" + service.upper()
        line = next(x for x in script.splitlines() if x.startswith(var + "="))
        assert f"gcloud functions describe {ps.function_name(service)} --gen2" in line


def test_dead_letter_forwarding_has_its_permissions(gcloud: Any) -> None:
    agent = "serviceAccount:service-$${project_number}@gcp-sa-pubsub.iam.gserviceaccount.com"
    topic_grants = {(p[0], flag(f, "--member"), flag(f, "--role")) for _, path, p, f in gcloud
                    if path == ("pubsub", "topics", "add-iam-policy-binding")}
    assert (ps.dead_letter_topic_id(), agent, "roles/pubsub.publisher") in topic_grants
    sub_grants = {(p[0], flag(f, "--member"), flag(f, "--role")) for _, path, p, f in gcloud
                  if path == ("pubsub", "subscriptions", "add-iam-policy-binding")}
    for plan in ps.plan_subscriptions(ROUTES):
        assert (plan.name, agent, "roles/pubsub.subscriber") in sub_grants


def test_every_workflow_in_the_repo_is_deployed(gcloud: Any) -> None:
    files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "workflows").glob("*.yaml")
                   if p.name.endswith(".workflows.yaml"))
    assert files
    deployed = {flag(f, "--source") or "": (p[0], f) for _, path, p, f in gcloud
                if path == ("workflows", "deploy")}
    assert sorted(deployed) == files
    for name, flags in deployed.values():
        assert re.fullmatch(r"[a-z][a-z0-9-]{0,62}", name)
        assert flag(flags, "--location") == "${_REGION}"
        assert flag(flags, "--service-account") == \
            "mtc-workflow@${_PROJECT}.iam.gserviceaccount.com"
        assert flag(flags, "--set-env-vars") == "MTC_STEPS_URL=$$STEPS_URL"


def test_firestore_indexes_are_deployed(gcloud: Any) -> None:
    indexes = json.loads((ROOT / "deploy" / "firestore.indexes.json").read_text())["indexes"]
    created = [(flag(f, "--collection-group"),
                [x.split("=", 1)[1] for x in f if x.startswith("--field-config=")])
               for _, path, _, f in gcloud if path == ("firestore", "indexes", "composite",
                                                       "create")]
    expected = [(i["collectionGroup"],
                 [f"field-path={x['fieldPath']},order={x['order'].lower()}" for x in i["fields"]])
                for i in indexes]
    assert created == expected
    assert ("outbox", ["field-path=time,order=ascending", "field-path=seq,order=ascending"]) \
        in created  # the outbox sweeper's ordered read needs it


def test_events_and_idempotency_records_have_a_ttl_policy(gcloud: Any) -> None:
    ttls = {(flag(f, "--collection-group"), p[0]) for _, path, p, f in gcloud
            if path == ("firestore", "fields", "ttls", "update") and "--enable-ttl" in f}
    assert ttls == {("events", "expire_at"), ("processed_events", "expire_at"),
                    ("alerts", "expire_at"),  # resolved alerts
                    ("operations", "expire_at"), ("audit_log", "expire_at")}


def test_every_collection_written_with_expire_at_has_a_ttl_policy(gcloud: Any) -> None:
    """Scan the code: a collection constant in a module that writes ``expire_at`` must be
    covered, so a new retention-bound collection cannot be forgotten here."""
    ttls = {flag(f, "--collection-group") for _, path, _, f in gcloud
            if path == ("firestore", "fields", "ttls", "update")}
    found = set()
    for path in [*(ROOT / "shared").rglob("*.py"), *(ROOT / "services").rglob("*.py")]:
        text = path.read_text()
        if '"expire_at"' not in text and "expire_at=" not in text:
            continue
        found |= set(re.findall(r'^[A-Z_]*(?:COLLECTION|EVENTS|PROCESSED|ALERTS|OPERATIONS)'
                                r'\s*=\s*"([a-z_]+)"', text, re.M))
    assert found and found <= ttls, found - ttls


def test_a_fresh_project_gets_its_firestore_database_first(build: dict[str, Any],
                                                           gcloud: Any) -> None:
    script = scripts(build)["firestore-database"]
    assert "gcloud firestore databases describe" in script.split("||")[0]
    assert "gcloud firestore databases create" in script.split("||")[1]
    creates = [f for _, path, _, f in gcloud if path == ("firestore", "databases", "create")]
    assert [flag(f, "--type") for f in creates] == ["firestore-native"]
    assert flag(creates[0], "--location") == "${_FIRESTORE_LOCATION}"
    for step in ("firestore-indexes", "firestore-ttls", *(
            s["id"] for s in build["steps"] if s["id"].startswith("deploy-"))):
        assert "firestore-database" in _ancestors(build, step), step


def test_the_service_agent_is_the_target_projects_looked_up_not_assumed(
        build: dict[str, Any]) -> None:
    text = CLOUDBUILD.read_text()
    assert "${PROJECT_NUMBER}" not in text  # Cloud Build's own: the build's project
    for step_id, script in scripts(build).items():
        if "gcp-sa-pubsub" in script:
            first = script.splitlines()[0]
            assert first == "project_number=$$(gcloud projects describe ${_PROJECT}" \
                            " '--format=value(projectNumber)')", step_id


def test_the_executor_identity_pulls_ordered_requests_and_publishes_results(
        build: dict[str, Any], gcloud: Any) -> None:
    executor = "serviceAccount:mtc-executor@${_PROJECT}.iam.gserviceaccount.com"
    created = {p[0] for _, path, p, _ in gcloud if path == ("iam", "service-accounts", "create")}
    assert {"mtc-executor", "mtc-node"} <= created
    name = "mtc-executor-${_EXECUTOR_ID}"  # services.executor's executor_subscription_id
    [sub] = [f for _, path, p, f in gcloud
             if path == ("pubsub", "subscriptions", "create") and p == [name]]
    assert flag(sub, "--topic") == "mtc-compute-requests"
    assert "--enable-message-ordering" in sub and flag(sub, "--push-endpoint") is None
    assert flag(sub, "--dead-letter-topic") == ps.dead_letter_topic_id()
    subscriber = {(p[0], flag(f, "--member")) for _, path, p, f in gcloud
                  if path == ("pubsub", "subscriptions", "add-iam-policy-binding")}
    assert {s for s, m in subscriber if m == executor} == {name}
    published = {p[0] for _, path, p, f in gcloud
                 if path == ("pubsub", "topics", "add-iam-policy-binding")
                 and flag(f, "--member") == executor}
    assert published == {ps.topic_id(f) for f in families()} | {ps.alerts_topic_id(),
                                                                ps.dead_letter_topic_id()}
    requesters = {flag(f, "--member") for _, path, p, f in gcloud
                  if path == ("pubsub", "topics", "add-iam-policy-binding")
                  and p == ["mtc-compute-requests"]}
    assert executor not in requesters and len(requesters) == len(SERVICES) + 2
    line = next(x for x in scripts(build)["service-accounts"].splitlines()
                if "compute.instanceAdmin.v1" in x)
    assert line.startswith('if [ "${_EXECUTOR_GCE}" = true ]; then ')
    assert "roles/iam.serviceAccountUser" in line and "mtc-node@" in line


def test_functions_start_the_workflow_where_it_drives_provisioning(gcloud: Any,
                                                                    build: dict[str, Any]) -> None:
    for _, path, _p, f in gcloud:
        if path == ("functions", "deploy"):
            env = dict(kv.split("=", 1) for kv in (flag(f, "--set-env-vars") or "").split(","))
            assert env["MTC_PROVISIONING"] == "${_PROVISIONING}"
            assert env["MTC_WORKFLOW_LOCATION"] == "${_REGION}"
    assert build["substitutions"]["_PROVISIONING"] == "workflow"
    deployed = {p[0] for _, path, p, _ in gcloud if path == ("workflows", "deploy")}
    from shared.adapters.workflows import WORKFLOW

    assert WORKFLOW == "mtc-provision-cluster" and WORKFLOW in deployed  # what it starts


@pytest.mark.slow
def test_dry_run_prints_the_plan_and_changes_nothing(tmp_path: Path) -> None:
    before = CLOUDBUILD.read_text()
    proc = subprocess.run([sys.executable, "-m", "deploy.cloudbuild", "--dry-run",
                           "--substitutions=_PROJECT=my-proj,_REGION=europe-west1"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith("Deployment plan: ") and "project my-proj, region europe-west1" in out
    assert "[1] unit-tests" in out and "firestore-database" in out
    assert "gcloud firestore databases create --database=(default) --location=nam5" \
           " --type=firestore-native" in out.replace('"', "")
    assert "${_" not in out  # every substitution filled in
    assert CLOUDBUILD.read_text() == before
    bad = subprocess.run([sys.executable, "-m", "deploy.cloudbuild", "--dry-run",
                          "--substitutions=_NOPE=1"], capture_output=True, text=True, cwd=ROOT,
                         timeout=120)
    assert bad.returncode != 0 and "_NOPE" in bad.stderr


def test_the_tick_is_scheduled_against_the_steps_function(gcloud: Any) -> None:
    jobs = [(path, f) for _, path, p, f in gcloud if path[:2] == ("scheduler", "jobs")
            and path[2] in ("create", "update")]
    assert len(jobs) == 2
    for _, flags in jobs:
        assert flag(flags, "--uri") == "$$STEPS_URL/tick"
        assert flag(flags, "--http-method") == "POST"
        assert flag(flags, "--oidc-service-account-email") == \
            "mtc-scheduler@${_PROJECT}.iam.gserviceaccount.com"


# the role the deploying account needs for each gcloud command group the build runs
DEPLOYER_ROLES = {
    ("services",): "roles/serviceusage.serviceUsageAdmin",
    ("firestore",): "roles/datastore.owner",
    ("iam", "service-accounts", "create"): "roles/iam.serviceAccountAdmin",
    ("iam", "service-accounts", "add-iam-policy-binding"): "roles/iam.serviceAccountAdmin",
    ("projects", "add-iam-policy-binding"): "roles/resourcemanager.projectIamAdmin",
    ("projects", "describe"): "roles/resourcemanager.projectIamAdmin",
    ("pubsub",): "roles/pubsub.admin",
    ("functions", "deploy"): "roles/cloudfunctions.admin",
    ("functions", "add-invoker-policy-binding"): "roles/run.admin",
    ("workflows",): "roles/workflows.admin",
    ("scheduler",): "roles/cloudscheduler.admin",
}


def test_docs_list_the_roles_the_deploying_account_needs(gcloud: Any) -> None:
    docs = (ROOT / "docs" / "gcp.md").read_text()
    table = docs[docs.index("### Roles the deploying account needs"):]
    table = table[:table.index("\n### ", 5)]
    for _, path, _, _ in gcloud:
        if path[:2] in (("iam", "service-accounts"),) and path[2] == "describe":
            continue  # reads: covered by the admin role
        if path[:2] == ("functions", "describe"):
            continue
        role = next((r for prefix, r in DEPLOYER_ROLES.items()
                     if path[:len(prefix)] == prefix), None)
        assert role is not None, f"no deployer role known for gcloud {' '.join(path)}"
        assert f"`{role}`" in table, f"docs/gcp.md does not list {role} (gcloud {path})"
    assert "`roles/iam.serviceAccountUser`" in table  # deploying as the runtime accounts
