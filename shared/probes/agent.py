"""``collect``: run every configured probe and assemble one HealthReport.

Each probe is isolated: a missing tool, a timeout, unparseable output or a bug in a probe
turns into ``unknown`` conditions with the reason, never into "healthy" and never into a
crash that would silence the other probes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from shared.domain.health import Condition, ConditionType, HealthReport
from shared.probes import dcgm, disk, nvidia_smi, speed
from shared.probes.commands import ProbeError, Runner, run_command
from shared.probes.conditions import unknown
from shared.probes.config import AgentConfig
from shared.probes.xid import XidEvent, XidSource, xid_condition

log = logging.getLogger(__name__)

MAX_PENDING_XIDS = 200  # an XID storm while the sink is down must not grow without bound

PROBE_CONDITIONS: dict[str, tuple[str, ...]] = {
    "xid": (ConditionType.XID_ERROR.value,),
    "nvidia_smi": nvidia_smi.NVIDIA_SMI_CONDITIONS,
    "dcgm": (ConditionType.DCGM_DIAG_FAILED.value,),
    "disk": (ConditionType.DISK_PRESSURE.value,),
    "speed": (ConditionType.SLOW_SPEED_CHECK.value,),
}


class SinceTracker:
    """Keeps a condition's ``since`` while its status is unchanged between reports."""

    def __init__(self) -> None:
        self._seen: dict[str, Condition] = {}

    def apply(self, conditions: Sequence[Condition]) -> tuple[Condition, ...]:
        out: list[Condition] = []
        for cond in conditions:
            previous = self._seen.get(cond.type)
            if previous is not None and previous.status == cond.status:
                cond = cond._replace(since=previous.since)
            self._seen[cond.type] = cond
            out.append(cond)
        return tuple(out)


@dataclass
class AgentState:
    """What survives between collections: the XID cursor, XIDs not yet delivered, and each
    condition's ``since``.

    XIDs are reported until ``acknowledge()`` says the report was delivered (published, or
    acted on by a Slurm health check): only then is the cursor persisted and the pending
    events dropped. A failed publish or drain therefore repeats the XID next time instead of
    losing the one signal that says the node is broken.
    """

    since: SinceTracker = field(default_factory=SinceTracker)
    xid_source: XidSource | None = None
    pending_xids: list[XidEvent] = field(default_factory=list)

    def acknowledge(self) -> None:
        self.pending_xids = []
        if self.xid_source is not None:
            self.xid_source.commit()

    def read_xids(self, config: AgentConfig, runner: Runner) -> list[XidEvent]:
        new = self.xid(config).read_new(runner, commit=False)
        self.pending_xids = [*self.pending_xids, *new][-MAX_PENDING_XIDS:]
        return list(self.pending_xids)

    def xid(self, config: AgentConfig) -> XidSource:
        if self.xid_source is None or self.xid_source.source != config.xid_source:
            self.xid_source = XidSource(
                config.xid_source,
                cursor_path=config.xid_cursor_path,
                dmesg_path=config.dmesg_path,
                timeout_s=config.command_timeout_s,
            )
        return self.xid_source


def collect(
    config: AgentConfig,
    now: float,
    *,
    runner: Runner = run_command,
    state: AgentState | None = None,
    speed_timer: Callable[[int], float] | None = None,
) -> HealthReport:
    """One observation of the node. Pass the same ``state`` each time in a long-running agent,
    and call ``state.acknowledge()`` once the report has been delivered."""
    state = state if state is not None else AgentState()
    probes: dict[str, Callable[[], list[Condition]]] = {
        "xid": lambda: [xid_condition(state.read_xids(config, runner), now)],
        "nvidia_smi": lambda: nvidia_smi.probe(
            runner,
            now,
            tool=config.nvidia_smi_path,
            timeout_s=config.command_timeout_s,
            thresholds=nvidia_smi.NvidiaSmiThresholds(volatile_dbe_max=config.volatile_dbe_max),
        ),
        "dcgm": lambda: [
            dcgm.probe(
                runner,
                now,
                tool=config.dcgmi_path,
                level=config.dcgm_level,
                timeout_s=config.dcgm_timeout_s,
            )
        ],
        "disk": lambda: [disk.probe(config.mounts, now, threshold=config.disk_threshold)],
        "speed": lambda: [
            speed.probe(
                now,
                baseline_s=config.speed_baseline_s,
                min_ratio=config.speed_min_ratio,
                size=config.speed_matrix_size,
                node_type=config.node_type,
                timer=speed_timer,
            )
        ],
    }
    conditions: list[Condition] = []
    for name in config.probes:
        conditions.extend(_run_probe(name, probes[name], now))
    return HealthReport(
        node_id=config.node_id,
        observed_at=now,
        conditions=state.since.apply(conditions),
        source="agent",
    )


def _run_probe(name: str, probe: Callable[[], list[Condition]], now: float) -> list[Condition]:
    ctypes = PROBE_CONDITIONS[name]
    try:
        return probe()
    except ProbeError as exc:
        return [unknown(ctype, now, exc.reason, {"probe": name}) for ctype in ctypes]
    except Exception as exc:  # a probe bug must not silence the other probes
        log.exception("probe %s crashed", name)
        reason = f"{name} probe crashed: {type(exc).__name__}: {exc}"[:300]
        return [unknown(ctype, now, reason, {"probe": name}) for ctype in ctypes]
