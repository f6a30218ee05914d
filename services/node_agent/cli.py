"""``mtc-agent``: run the node agent once, periodically, or as Slurm's HealthCheckProgram.

    mtc-agent --once [--publish-url URL]         print (and publish) one report
    mtc-agent --interval 30 --publish-url URL    report every 30 s until killed
    mtc-agent --interval 30 --config /etc/mtc/agent.json   production (systemd): the config's
        "delivery" object picks the transport (pubsub with the machine's identity, or the API
        with a token file) and the spool every report is written to before it is sent
    mtc-agent --spool-status --config /etc/mtc/agent.json   queued, coalesced, dropped, sent
    mtc-agent --slurm-healthcheck [--drain-on-fault]
        one check for the node in $SLURMD_NODENAME; with --drain-on-fault a node with any
        problem condition drains itself through scontrol (the "plain drain" baseline the
        control plane is compared against). Always exits 0: a non-zero exit would only make
        slurmd log noise, and an unknown check must not drain a node.

With ``--interval`` the agent also watches the ranks of managed jobs running on its node
(``shared.adapters.compute.node_hangs``, the stuck-state rules: it cannot read their output):
a rank stopped or in uninterruptible sleep past its limit goes out in the report as
``HangInJob`` on this node, naming the rank (``MTC_HANG_STOPPED_S``, ``MTC_HANG_D_STATE_S``).

Console script entry point: ``services.node_agent.cli:main``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TextIO

from services.node_agent.publish import Publish, http_publisher, report_data, report_to_cloudevent
from services.node_agent.spool import Send, Spool, SpooledReport
from services.node_agent.transports import DeliveryConfig, cloudevent_attributes, sender
from shared.adapters.compute.node_hangs import NodeHangWatch, stuck_only
from shared.adapters.compute.slurm.cli import SlurmCli
from shared.domain.errors import ValidationError
from shared.domain.health import Condition, ConditionStatus, HealthReport
from shared.probes.agent import AgentState, collect
from shared.probes.commands import Runner, run_command
from shared.probes.config import ALL_PROBES, AgentConfig

log = logging.getLogger("mtc.node_agent")


class Drainer(Protocol):
    def drain(self, node: str, reason: str) -> None: ...


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mtc-agent", description="mtc node health agent")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--once", action="store_true", help="collect one report and print it")
    mode.add_argument("--interval", type=float, metavar="S", help="collect every S seconds")
    mode.add_argument("--spool-status", action="store_true",
                      help="print the spool's counters (queued, coalesced, dropped, sent)")
    mode.add_argument(
        "--slurm-healthcheck",
        action="store_true",
        help="run once as Slurm's HealthCheckProgram for $SLURMD_NODENAME",
    )
    parser.add_argument("--config", metavar="FILE", help="JSON file with AgentConfig fields")
    parser.add_argument("--node-id", help="node id (default: config, $SLURMD_NODENAME, hostname)")
    parser.add_argument("--node-type", help="node type, selects the speed baseline")
    parser.add_argument("--xid-source", help="'dmesg' or a kernel log file")
    parser.add_argument("--xid-cursor", help="file that persists the XID cursor")
    parser.add_argument("--mount", action="append", help="mount to check (repeatable)")
    parser.add_argument(
        "--skip",
        action="append",
        default=[],
        metavar="PROBE",
        help=f"probe(s) to skip, comma separated: {','.join(ALL_PROBES)}",
    )
    parser.add_argument("--publish-url", help="POST each report there as a binary CloudEvent")
    parser.add_argument("--spool", metavar="FILE",
                        help="sqlite spool every report is written to before it is sent")
    parser.add_argument(
        "--drain-on-fault",
        action="store_true",
        help="with --slurm-healthcheck: drain the node when a condition is true",
    )
    parser.add_argument("--slurm-conf", help="SLURM_CONF for the drain command")
    parser.add_argument("-v", "--verbose", action="store_true")
    return parser


def load_delivery(args: argparse.Namespace) -> DeliveryConfig:
    """The config file's "delivery" object (absent: no transport), --spool overriding."""
    data: dict[str, Any] = {}
    if args.config:
        with open(args.config, encoding="utf-8") as handle:
            doc = json.load(handle)
        data = dict(doc.get("delivery") or {}) if isinstance(doc, dict) else {}
    if args.spool:
        data["spool_path"] = args.spool
    return DeliveryConfig.from_dict(data)


def load_config(args: argparse.Namespace, environ: Mapping[str, str]) -> AgentConfig:
    skip = {p.strip() for chunk in args.skip for p in chunk.split(",") if p.strip()}
    overrides: dict[str, Any] = {
        "node_type": args.node_type,
        "xid_source": args.xid_source,
        "xid_cursor_path": args.xid_cursor,
        "mounts": tuple(args.mount) if args.mount else None,
    }
    node_id = args.node_id
    if args.slurm_healthcheck:
        node_id = node_id or environ.get("SLURMD_NODENAME")
        if not node_id:
            raise ValidationError("SLURMD_NODENAME", "is not set (not run by slurmd?)")
    overrides["node_id"] = node_id
    if args.config:
        config = AgentConfig.load(args.config, **overrides)
    else:
        overrides["node_id"] = node_id or os.uname().nodename
        config = AgentConfig(**{k: v for k, v in overrides.items() if v is not None})
    unknown = skip - set(ALL_PROBES)
    if unknown:
        raise ValidationError("--skip", f"unknown probes {sorted(unknown)}")
    if skip:
        config = config.with_overrides(probes=tuple(p for p in config.probes if p not in skip))
    return config


def faults(report: HealthReport) -> list[str]:
    """Short text per problem condition, for a Slurm drain reason."""
    return [f"{c.type}: {c.reason}" for c in report.conditions if c.status is ConditionStatus.TRUE]


def main(
    argv: Sequence[str] | None = None,
    *,
    publish_factory: Callable[[str], Publish] = http_publisher,
    sender_factory: Callable[[DeliveryConfig], Send | None] = sender,
    drainer_factory: Callable[[str | None], Drainer] | None = None,
    runner: Runner = run_command,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
    environ: Mapping[str, str] | None = None,
    stdout: TextIO | None = None,
    max_iterations: int | None = None,
) -> int:
    """Entry point; every collaborator with I/O is injectable so tests need no network/Slurm."""
    args = build_parser().parse_args(argv)
    env = os.environ if environ is None else environ
    out = stdout or sys.stdout
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        config = load_config(args, env)
        delivery = load_delivery(args)
        spool = (Spool(delivery.spool_path, max_reports=delivery.spool_max_reports,
                       max_bytes=delivery.spool_max_bytes) if delivery.spool_path else None)
        publish = publish_factory(args.publish_url) if args.publish_url else None
        send = _url_send(publish) if publish is not None else sender_factory(delivery)
    except (ValidationError, OSError, ValueError, TypeError) as exc:
        log.error("bad configuration: %s", exc)
        return 0 if args.slurm_healthcheck else 2
    state = AgentState()
    # only a running agent sees how long a rank stays stuck (one check sees an instant)
    hangs = NodeHangWatch(new_watch=lambda: stuck_only(env)) if args.interval else None
    if args.spool_status:
        if spool is None:
            log.error("no spool configured (delivery.spool_path or --spool)")
            return 2
        out.write(json.dumps(spool.stats(), sort_keys=True) + "\n")
        return 0

    def flush() -> None:
        if spool is None or send is None:
            return
        result = spool.flush(send)
        if result.error:
            log.warning("%d report(s) spooled, delivery failing: %s", result.left, result.error)
        elif result.sent:
            log.info("delivered %d report(s); stats %s", result.sent, spool.stats())

    def once(acknowledge: bool = True) -> HealthReport:
        report = collect(config, clock(), runner=runner, state=state)
        if hangs is not None:
            found = Condition.parse_all(hangs.conditions(report.node_id, report.observed_at))
            report = HealthReport(report.node_id, report.observed_at,
                                  report.conditions + found, report.source)
        out.write(json.dumps(report_data(report), sort_keys=True) + "\n")
        out.flush()
        if spool is not None:  # durable from here on: the XIDs it holds are delivered later
            spool.append(str(uuid.uuid4()), report_data(report))
            if acknowledge:
                state.acknowledge()
            flush()
            return report
        if send is not None:  # no spool: one try; the XIDs stay pending if it fails
            try:
                if publish is not None:
                    publish(report_to_cloudevent(report))
                else:
                    send(SpooledReport(0, str(uuid.uuid4()), report.node_id, report.observed_at,
                                       report_data(report)))
            except Exception as exc:  # keep the XIDs pending: the next report repeats them
                log.warning("publishing (%s) failed: %s", delivery.transport, exc)
                return report
        if acknowledge:
            state.acknowledge()
        return report

    if args.once:
        once()
        return 0
    if args.slurm_healthcheck:
        return _healthcheck(once, state, config, args, drainer_factory)
    iterations = 0
    while max_iterations is None or iterations < max_iterations:
        started = clock()
        try:
            once()
        except Exception:  # keep the agent alive: a dead agent reads as a lost heartbeat
            log.exception("collection failed")
            try:
                flush()  # what is spooled still goes out
            except Exception:
                log.exception("flushing the spool failed")
        iterations += 1
        if max_iterations is None or iterations < max_iterations:
            sleep(max(0.0, args.interval - (clock() - started)))
    return 0


def _healthcheck(
    once: Callable[[bool], HealthReport],
    state: AgentState,
    config: AgentConfig,
    args: argparse.Namespace,
    drainer_factory: Callable[[str | None], Drainer] | None,
) -> int:
    """One check; drain on a fault. The XID cursor is committed only once the fault was acted
    on, so a drain that failed (controller down) is retried by the next health check."""
    try:
        report = once(False)
        found = faults(report)
        if found and args.drain_on_fault:
            reason = ("mtc-agent " + "; ".join(found))[:250]
            factory = drainer_factory or _default_drainer
            factory(args.slurm_conf).drain(config.node_id, reason)
            log.warning("drained %s: %s", config.node_id, reason)
        state.acknowledge()
    except Exception:
        log.exception("slurm health check failed")
    return 0


def _url_send(publish: Publish) -> Send:
    from cloudevents.http import CloudEvent

    def send(report: SpooledReport) -> None:
        publish(CloudEvent(cloudevent_attributes(report), dict(report.data)))

    return send


def _default_drainer(slurm_conf: str | None) -> Drainer:
    return SlurmCli(timeout_s=15.0, slurm_conf=slurm_conf)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
