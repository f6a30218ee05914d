"""`mtc`: clusters, jobs and nodes through the Vertex AI API, locally or on a server.

Locally (the default) every command opens the state directory and calls the API's resource
functions in process: whoever can open the directory owns it, no token needed. With
``--api URL`` (or ``MTC_API``) the same commands go over HTTP to ``mtc serve``, with a bearer
token from ``--token``, ``MTC_API_TOKEN`` or ``<state-dir>/api-token``. Both print the same
wire JSON (``--json``) or the same tables. Faults, events, the controller, the demo and
tokens act on the local state directory only.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mtc_program.protocol import PROCESSES_PER_NODE
from services.api.errors import ApiError
from services.api.names import parent
from services.api.security import ADMIN_TOKEN_FILE
from services.cli import commands_endpoint
from services.cli import commands_policy as policy_commands
from services.cli.bench_recovery import add_parser as add_bench
from services.cli.bench_recovery import cmd_bench_recovery
from services.cli.client import Client, ClientError, HttpClient, LocalClient, checked_url
from services.cli.commands_api import NODE_VERBS, cmd_cluster, cmd_job, cmd_node_op, cmd_nodes
from services.cli.commands_local import (
    LOCAL_ONLY,
    cmd_controller,
    cmd_demo,
    cmd_events,
    cmd_fault,
    cmd_token,
)
from services.cli.commands_logs import cmd_job_logs, cmd_tensorboard
from services.cli.commands_recipe import add_parser as add_recipe
from services.cli.commands_state import cmd_state
from services.wiring.embedded import embedded
from shared.domain.errors import MtcError, NotFound, ValidationError

DEFAULT_PROJECT = DEFAULT_LOCATION = "local"
API_COMMANDS = {"cluster", "job", "endpoint", "recipe", "node list",
                *(f"node {v}" for v in NODE_VERBS), *(f"policy {v}" for v in policy_commands.COMMANDS)}
# packaged data, or files named on the command line: no state, no server
OFFLINE_COMMANDS = {"recipe list", "recipe show",
                    *(f"policy {v}" for v in policy_commands.OFFLINE)}
DEFAULT_STATE_DIR = "var/mtc"


def _common(*, remote: bool = True) -> argparse.ArgumentParser:
    """Options every command also takes after its name (``mtc job list --json``); a command
    that works on the local state only (``remote=False``) does not offer ``--api``."""
    c = _state_dir_option()
    s = argparse.SUPPRESS
    c.add_argument("--json", action="store_true", default=s, help="print the wire JSON")
    c.add_argument("--project", default=s, help="the project (env MTC_PROJECT; default local)")
    c.add_argument("--location", default=s,
                   help="the location (env MTC_LOCATION; default local)")
    if not remote:
        return c
    c.add_argument("--api", default=s, metavar="URL",
                   help="a running `mtc serve` (env MTC_API); default: the local state dir")
    c.add_argument("--token", default=s, help="bearer token for --api (env MTC_API_TOKEN; "
                   "default: <state-dir>/api-token)")
    return c


def _state_dir_option() -> argparse.ArgumentParser:
    """``--state-dir``, also after a command's name (``mtc serve --state-dir DIR``)."""
    c = argparse.ArgumentParser(add_help=False)
    c.add_argument("--state-dir", default=argparse.SUPPRESS, metavar="DIR",
                   help=f"the embedded state (env MTC_STATE_DIR; default {DEFAULT_STATE_DIR})")
    return c


TWIN_COMMANDS = ("sim", "replay")


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The whole parser; given an ``argv`` that names another command, one without the
    twin's subcommands, whose imports are a fifth of a command's start-up."""
    p = argparse.ArgumentParser(prog="mtc", description=__doc__.splitlines()[0])
    p.add_argument("--state-dir", default=None,
                   help="where the embedded control plane keeps its state (env MTC_STATE_DIR; "
                   f"default {DEFAULT_STATE_DIR}); `mtc demo` keeps its own in a "
                   "subdirectory of it (default var/demo)")
    p.add_argument("--json", action="store_true", help="print the wire JSON, not tables")
    p.add_argument("--project", default=None, help="the project (env MTC_PROJECT; default local)")
    p.add_argument("--location", default=None,
                   help="the location (env MTC_LOCATION; default local)")
    p.add_argument("--api", default=None, metavar="URL",
                   help="talk to a running `mtc serve` at URL (env MTC_API)")
    p.add_argument("--token", default=None,
                   help="bearer token for --api (env MTC_API_TOKEN; default: the file "
                   "<state-dir>/api-token that `mtc serve` writes)")
    sub = p.add_subparsers(dest="command", required=True)
    common = [_common()]

    def leaf(parent_sub: Any, name: str, help_text: str | None = None) -> Any:
        return parent_sub.add_parser(name, parents=common, help=help_text,
                                     description=help_text)

    local = [_common(remote=False)]

    def local_leaf(parent_sub: Any, name: str, help_text: str) -> Any:
        """A command of the local state only: its help offers no --api."""
        return parent_sub.add_parser(name, parents=local, help=help_text,
                                     description=help_text)

    c = sub.add_parser("cluster", help="create, get, list, update, delete, nodes of "
                       "modelDevelopmentClusters")
    csub = c.add_subparsers(dest="action", required=True)
    for name in ("create", "update"):
        x = leaf(csub, name, f"{name} a cluster from a ModelDevelopmentCluster JSON body")
        x.add_argument("cluster_id")
        x.add_argument("-f", "--file", required=True,
                       help="ModelDevelopmentCluster JSON ('-' for stdin)")
        x.add_argument("--wait", type=float, default=0.0, metavar="S",
                       help="wait up to S seconds on the Operation (until READY)")
    leaf(csub, "get").add_argument("cluster_id")
    x = leaf(csub, "delete")
    x.add_argument("cluster_id")
    x.add_argument("--wait", type=float, default=0.0, metavar="S",
                   help="wait up to S seconds on the Operation (until gone)")
    leaf(csub, "list").add_argument("--filter", help='e.g. state="READY"')
    x = leaf(csub, "report-faulty", "delete faulty nodes (each recreated under its own "
             "name) or, with --host, report their hosts; through the jobs' recovery and the "
             "blast-radius guard; audited")
    x.add_argument("cluster_id")
    x.add_argument("node_ids", nargs="+", metavar="NODE")
    x.add_argument("--host", action="store_true", help="report the hosts as faulty")
    x.add_argument("--behavior", default="BEHAVIOR_UNSPECIFIED", choices=[
        "BEHAVIOR_UNSPECIFIED", "PERFORMANCE", "SILENT_DATA_CORRUPTION",
        "UNRECOVERABLE_GPU_ERROR"], help="with --host: what the host did")
    x.add_argument("--description", default="", help="with --host: what was seen")
    x.add_argument("--wait", type=float, default=0.0, metavar="S",
                   help="wait up to S seconds on the Operation (nodes back or held)")
    x = leaf(csub, "rollout", "roll a software version (node image, driver, agent) out in "
             "waves, each node reimaged and deep-checked; a regression rolls it back")
    x.add_argument("cluster_id")
    x.add_argument("--node-image", help="the node image")
    x.add_argument("--driver", help="the GPU driver version")
    x.add_argument("--agent", help="the node agent version")
    x.add_argument("--wave-size", type=int, default=1, metavar="N",
                   help="nodes per wave (capped by the blast-radius guard)")
    x.add_argument("--canary", type=int, default=1, metavar="N",
                   help="nodes in the first wave, alone")
    x.add_argument("--wait", type=float, default=0.0, metavar="S",
                   help="wait up to S seconds on the Operation (all updated, or rolled back)")
    x = leaf(csub, "nodes", "the cluster's nodes, sinfo-like")
    x.add_argument("cluster_id")
    x.add_argument("--all", action="store_true", help="include retired nodes")
    c.set_defaults(fn=cmd_cluster)

    commands_endpoint.add_parser(sub, leaf)

    j = sub.add_parser("job", help="submit, get, list, cancel, delete customJobs")
    jsub = j.add_subparsers(dest="action", required=True)
    s = leaf(jsub, "submit", "submit a CustomJob JSON body")
    s.add_argument("-f", "--file", required=True, help="CustomJob JSON ('-' for stdin)")
    s.add_argument("--cluster", help="the cluster, when the file's "
                   "jobSpec.persistentResourceId names none")
    s.add_argument("--job-id", help="a client-chosen id makes retries idempotent")
    for name in ("get", "cancel", "delete"):
        leaf(jsub, name).add_argument("job_id")
    x = leaf(jsub, "list")
    x.add_argument("--filter", help='e.g. state="JOB_STATE_RUNNING" AND labels.team=x')
    x.add_argument("--cluster", help="only the jobs on this cluster")
    j.set_defaults(fn=cmd_job)
    x = leaf(jsub, "logs", "a worker's output: one rank of one attempt (default rank 0 of the "
             "newest); through --api too")
    x.add_argument("job_id")
    x.add_argument("--rank", type=int, help="the program's RANK (default 0); ranks that "
                   f"share a replica ({PROCESSES_PER_NODE}) read that replica's log")
    x.add_argument("--attempt", type=int, help="the attempt (default the newest)")
    x.add_argument("--tail", type=int, metavar="N", help="only the last N lines")
    x.add_argument("--follow", action="store_true", help="keep printing new lines (into the "
                   "next attempt on a restart) until the job has ended")
    x.set_defaults(fn=cmd_job_logs)

    n = sub.add_parser("node", help="list nodes (sinfo-like); inject faults (local only)")
    nsub = n.add_subparsers(dest="action", required=True)
    nl = leaf(nsub, "list", "nodes of one cluster, or of every cluster")
    nl.add_argument("--cluster")
    nl.add_argument("--all", action="store_true", help="include retired nodes")
    for verb, what in (("release-hold", "let the repair the blast-radius guard held run now"),
                       ("drain", "drain a node (its job checkpoints and moves); it stays "
                        "out, unrepaired, until an operator resumes it"),
                       ("resume", "return a node an operator drained (verified first if "
                        "it had faults)"),
                       ("return", "verify a FAILED node and return it to service")):
        x = leaf(nsub, verb, what + "; audited")
        x.add_argument("node_id")
        x.add_argument("--cluster", required=True, help="the node's cluster")
        x.add_argument("--reason", required=True, help="why (goes in the audit record)")
        x.set_defaults(fn=cmd_node_op)
    f = local_leaf(nsub, "fault", "inject a health fault, as a node agent would report it; "
             + LOCAL_ONLY)
    f.add_argument("node_id")
    f.add_argument("--xid", type=int, action="append", help="an NVIDIA XID code (repeatable)")
    f.add_argument("--ecc-dbe", type=int, help="volatile double-bit ECC errors")
    f.add_argument("--row-remap-failure", action="store_true")
    f.add_argument("--dcgm-fail", type=int, choices=[1, 2, 3, 4], help="failed DCGM level")
    f.add_argument("--thermal", type=float, metavar="CELSIUS")
    f.add_argument("--disk", type=float, metavar="USED_FRACTION")
    f.add_argument("--slow", type=float, metavar="RATIO_TO_BASELINE")

    e = local_leaf(sub, "events", "the timeline; " + LOCAL_ONLY)
    e.add_argument("--since", type=float, default=0.0, metavar="UNIX_TIME",
                   help="only events at or after this time (default: all kept)")
    e.add_argument("--follow", type=float, metavar="S", help="keep printing for S seconds")
    e.add_argument("--all", action="store_true", help="include routine heartbeats")
    e.set_defaults(fn=cmd_events)

    policy_commands.add_parser(sub, leaf, local_leaf)

    t = sub.add_parser("token", help="API tokens for `mtc serve` (local state only)")
    tsub = t.add_subparsers(dest="action", required=True)
    x = local_leaf(tsub, "create", "mint a token (printed once); " + LOCAL_ONLY)
    x.add_argument("--role", required=True,
                   choices=["viewer", "editor", "admin", "node-agent"])
    x.add_argument("--name", required=True, help="the principal is token:NAME")
    x.epilog = "--project P binds the role on P only (default: every project, '*')"
    local_leaf(tsub, "list", "the tokens (ids, principals, roles; never the tokens)")
    local_leaf(tsub, "revoke", "revoke a token by id").add_argument("token_id")

    st = sub.add_parser("state", help="the state directory: check it, back it up, restore it "
                        "(local state only)")
    ssub = st.add_subparsers(dest="action", required=True)
    local_leaf(ssub, "check", "each database's integrity check, and the files agree with each other")
    local_leaf(ssub, "backup", "an online copy of the databases and the token file into DEST (new)"
         ).add_argument("dest", metavar="DEST")
    local_leaf(ssub, "restore", "put a backup back (stop mtc serve first)"
         ).add_argument("source", metavar="BACKUP")

    add_recipe(sub, common)

    tb = local_leaf(sub, "tensorboard", "TensorBoard on 127.0.0.1 over a CustomJob's event files (a "
              "run per attempt) or a HyperparameterTuningJob's (per trial); " + LOCAL_ONLY)
    tb.add_argument("job_id", help="a customJob or hyperparameterTuningJob id")
    tb.add_argument("--port", type=int, default=0, help="default: a free port")
    tb.set_defaults(fn=cmd_tensorboard)

    ctl = local_leaf(sub, "controller", "run the embedded control plane loop; " + LOCAL_ONLY)
    ctl.add_argument("--for", dest="duration", type=float, metavar="S", help="stop after S s")
    ctl.set_defaults(fn=cmd_controller)

    sv = sub.add_parser("serve", help="run the Vertex AI API and the control plane together",
                        parents=[_state_dir_option()])
    sv.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    sv.add_argument("--port", type=int, default=8080, help="port to bind (0: a free one)")
    sv.add_argument("--for", dest="duration", type=float, metavar="S", help="stop after S s")
    sv.add_argument("--threads", type=int, default=8, metavar="N",
                    help="request threads (default 8); the control loop has its own")
    sv.add_argument("--connections-per-client", type=_at_least_one, default=None, metavar="N",
                    help="connections one address may hold while it has nothing asked "
                    "(default 32); a new one takes the place of its oldest (docs/server.md)")
    sv.add_argument("--jobs-volume", choices=("on", "off"),
                    default=os.environ.get("MTC_JOBS_VOLUME") or "on",
                    help="as root, job outputs on a file system of their own (a loop-mounted "
                    "image beside <state>/jobs), so a job that fills it never fills the "
                    "state's (default on, or $MTC_JOBS_VOLUME; docs/security.md)")
    sv.add_argument("--sim-dir", type=Path, default=None, metavar="DIR",
                    help="a twin run directory (mtc sim run/sweep --out DIR): the console "
                    "shows its plots and tables")

    add_bench(sub, local)

    d = local_leaf(sub, "demo", "the self-healing story, start to end, in one run; " + LOCAL_ONLY)
    d.add_argument("--steps", type=int, default=120, help="the demo job's training steps")
    d.add_argument("--torch", action="store_true", help="the story with a real PyTorch job: "
                   "the pretrain recipe on 2 nodes x 2 ranks through an XID 79 and a SIGKILL "
                   "of one rank, checked against an uninterrupted run (`make demo-torch`)")
    d.set_defaults(fn=cmd_demo)

    words = [a for a in (argv or []) if not a.startswith("-")]
    if any(w in sub.choices for w in words) and not any(w in TWIN_COMMANDS for w in words):
        return p
    try:
        from simulator.cli import add_parser as add_sim
        from simulator.cli import add_replay_parser as add_replay
    except ImportError:
        pass
    else:
        add_sim(sub)
        add_replay(sub)
    return p


def command_name(args: argparse.Namespace) -> str:
    action = getattr(args, "action", None)
    return f"{args.command} {action}" if action else args.command


def report(exc: ClientError) -> None:
    print(f"error: {exc.status}: {exc.message}", file=sys.stderr)
    for field, description in exc.violations:
        if exc.message != f"{field}: {description}":
            print(f"  {field}: {description}", file=sys.stderr)


def _status(exc: MtcError) -> str:
    if isinstance(exc, ValidationError):
        return "INVALID_ARGUMENT"
    if isinstance(exc, NotFound):
        return "NOT_FOUND"
    return "FAILED_PRECONDITION"


def api_token(args: argparse.Namespace, state_dir: Path) -> str:
    token = args.token or os.environ.get("MTC_API_TOKEN")
    if token:
        return str(token).strip()
    path = state_dir / ADMIN_TOKEN_FILE
    try:
        return path.read_text().strip()
    except OSError:
        raise ClientError("UNAUTHENTICATED", f"no API token for {args.api}: pass --token, set "
                          f"MTC_API_TOKEN, or point --state-dir at the server's (no {path})"
                          ) from None


def _at_least_one(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(argv).parse_args(argv)
    if args.command in TWIN_COMMANDS:
        return int(args.fn(args) or 0)
    named = args.state_dir or os.environ.get("MTC_STATE_DIR") or None
    state_dir = Path(named or DEFAULT_STATE_DIR)
    if args.command == "serve":
        from services.cli.serve import serve

        try:
            return serve(state_dir, host=args.host, port=args.port, duration_s=args.duration,
                         sim_dir=args.sim_dir, threads=args.threads,
                         per_client=args.connections_per_client,
                         jobs_volume=args.jobs_volume == "on")
        except MtcError as exc:  # a damaged or unreadable state: named, not a traceback
            report(ClientError(_status(exc), str(exc)))
            return 2
    args.api = args.api or os.environ.get("MTC_API") or None
    name = command_name(args)
    if args.command == "bench":
        try:
            return cmd_bench_recovery(args, named)
        except MtcError as exc:
            report(ClientError(_status(exc), str(exc)))
            return 2
    try:
        api_command = args.command in API_COMMANDS or name in API_COMMANDS
        if args.api and not api_command:
            raise ClientError("FAILED_PRECONDITION", f"`mtc {name}` {LOCAL_ONLY} (drop --api, "
                              "unset MTC_API)")
        if name in OFFLINE_COMMANDS:
            args.fn(args, None)
        elif args.command == "token":
            cmd_token(args, state_dir)
        elif args.command == "state":
            cmd_state(args, state_dir)
        elif api_command:
            _run_api(args, state_dir)
        else:
            _run_local(args, state_dir, named)
    except ClientError as exc:
        report(exc)
        return 2
    except MtcError as exc:
        report(ClientError(_status(exc), str(exc)))
        return 2
    return 0


def _run_api(args: argparse.Namespace, state_dir: Path) -> None:
    try:
        args.parent = parent(args.project or os.environ.get("MTC_PROJECT") or DEFAULT_PROJECT,
                             args.location or os.environ.get("MTC_LOCATION")
                             or DEFAULT_LOCATION)
    except ApiError as exc:
        raise ClientError.from_status(exc.status_json(), exc.status) from exc
    run = cmd_nodes if command_name(args) == "node list" else args.fn
    if args.api:
        client: Client = HttpClient(checked_url(args.api), api_token(args, state_dir))
        run(args, client)
        return
    app = embedded(state_dir)
    try:
        pause = float(os.environ.get("MTC_TEST_PAUSE_BEFORE_PUMP") or 0)
        run(args, LocalClient(app, pause_before_pump=pause))
    finally:
        app.close()


def _run_local(args: argparse.Namespace, state_dir: Path, named: str | None) -> None:
    options: dict[str, Any] = {}
    if args.command == "demo":
        from services.cli.demo import (
            demo_compute_options,
            demo_config,
            demo_state_dir,
            fresh_state,
        )

        # the demo's own directory (a subdirectory of one the user named): only it is wiped
        state_dir = fresh_state(demo_state_dir(named))
        options = {"config": demo_config(torch=bool(getattr(args, "torch", False))),
                   "compute_options": demo_compute_options()}
    app = embedded(state_dir, **options)
    try:
        (cmd_fault if args.command == "node" else args.fn)(args, app)
    finally:
        app.close()


if __name__ == "__main__":
    raise SystemExit(main())
