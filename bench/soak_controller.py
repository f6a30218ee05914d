"""The soak's control loop, in a child process the soak can ``kill -9`` and start again.

    python -m bench.soak_controller --state-dir DIR --settings JSON [--for S] [--port P]

The same loop as ``mtc controller`` (``EmbeddedApp.run``: pump, poll the machines, tick),
but over the soak's settings (short retention, fast repairs), which ``mtc controller`` has
no flags for. With ``--port``, it is ``mtc serve`` instead (its control loop on a thread, the
API on waitress, the token from ``MTC_API_TOKEN``): the soak's stalled clients and busy
store go against the real server. Either way the state is checked first (``verify``): a
damaged state directory is refused, named, with exit status 2.
Everything it knows is in the state directory (sqlite store + outbox + LocalCompute's sqlite
file), so a SIGKILL at any instant must lose nothing: that is what the
soak checks.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from dataclasses import replace
from pathlib import Path
from types import FrameType
from typing import Any

from services.cli.serve import serve
from services.wiring.embedded import EmbeddedApp, embedded
from shared.config import ControlPlaneConfig
from shared.domain.errors import StateError
from shared.domain.health import RepairAction
from shared.policies.repair import RepairConfig

PROGRESS_TIMEOUT_S = 15.0  # no checkpoint for this long (x3 the longest gap seen): interrupt


def soak_config(settings: dict[str, Any]) -> ControlPlaneConfig:
    """The control plane's settings for a soak (all times in seconds)."""
    base = ControlPlaneConfig()
    repair = replace(RepairConfig(),
                     max_out_of_service_fraction=settings["max_out_of_service_fraction"],
                     blast_window_s=settings["blast_window_s"])
    return replace(base, repair=repair,
                   grace_period_s=settings["grace_period_s"],
                   heartbeat_timeout_s=settings["heartbeat_timeout_s"],
                   alert_reminder_s=settings["alert_reminder_s"],
                   max_event_age_s=settings["max_event_age_s"],
                   retention_s=settings["retention_s"],
                   idempotency_retention_s=settings["idempotency_retention_s"],
                   prune_interval_s=settings["prune_interval_s"],
                   # the hung-job watchdog at soak scale: a SIGSTOPped rank is noticed, not left
                   progress_timeout_s=settings.get("progress_timeout_s", PROGRESS_TIMEOUT_S))


def soak_compute_options(settings: dict[str, Any]) -> dict[str, Any]:
    durations = {RepairAction(k): float(v) for k, v in settings["repair_durations_s"].items()}
    return {"repair_durations_s": durations,
            "provision_duration_s": settings["provision_duration_s"],
            "agent_interval_s": settings["agent_interval_s"]}


def open_app(state_dir: Path, settings: dict[str, Any], *, verify: bool = False) -> EmbeddedApp:
    return embedded(state_dir, config=soak_config(settings),
                    compute_options=soak_compute_options(settings), verify=verify)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--state-dir", required=True)
    p.add_argument("--settings", required=True, help="the soak's settings, as JSON")
    p.add_argument("--for", dest="duration", type=float, default=float("inf"))
    p.add_argument("--port", type=int, default=None, help="serve the API on 127.0.0.1:PORT")
    args = p.parse_args(argv)
    settings = json.loads(args.settings)
    try:
        app = open_app(Path(args.state_dir), settings, verify=True)
    except StateError as exc:  # refused, named: the soak restores a backup and starts again
        print(f"soak controller: refusing to start: {exc}", file=sys.stderr, flush=True)
        return 2
    if args.port is not None:
        return serve(app.state_dir, app=app, port=args.port, out=lambda s: print(s, flush=True),
                     duration_s=None if args.duration == float("inf") else args.duration,
                     pump_s=settings["controller_poll_s"], tick_s=settings["tick_s"])

    def stop(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    try:
        app.run(lambda: False, timeout_s=args.duration, poll_s=settings["controller_poll_s"],
                tick_s=settings["tick_s"])
    except KeyboardInterrupt:
        pass
    finally:
        app.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
