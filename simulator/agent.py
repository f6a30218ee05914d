"""The node agent of every simulated node: what it reports, and when.

A fault is reported after its detection delay (a heartbeat timeout on top for a node that
went silent) and again at the agent's interval while it persists; a transient one that has
cleared is reported healthy once. After a provisioning or a repair the agent runs its checks
and reports them until the control plane has decided (the node is back, or gone); a node
whose fault a repair did not clear fails them. Deep checks (DCGM level 3 and the collective
test) report after ``DEEP_CHECK_S``. :class:`Agent` holds the fleet; it only emits events.
"""

from __future__ import annotations

from shared.domain.events import Envelope, NodeHealthReported, NodeRetired, NodeReturnedToService
from shared.domain.health import ConditionType
from simulator.clock import EPOCH_S, call_later
from simulator.failures import Fault, fault_conditions, healthy_conditions
from simulator.fleet import Fleet
from simulator.streams import DETECT_DOMAIN
from simulator.world import AGENT_SOURCE, SimNode


class Agent:
    """Every node's agent: fault reports, post-repair checks, deep checks."""

    # DCGM level 3 on 8 GPUs (tens of minutes) plus the collective test, in simulated seconds
    DEEP_CHECK_S = 2700.0

    def __init__(self, fleet: Fleet, *, return_after_passes: int,
                 heartbeat_timeout_s: float) -> None:
        self.fleet = fleet
        self.return_after_passes = return_after_passes
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self._deep_checks: set[tuple[str, int]] = set()
        # a rollout's staged version per node, and the version that fails the gate (a bad
        # rollout: simulator.rollout_model), None when no version does
        self.staged: dict[str, dict[str, str]] = {}
        self.bad_version: dict[str, str] | None = None
        fleet.bus.listen(self._observe, NodeReturnedToService, NodeRetired)

    def _observe(self, envelope: Envelope) -> None:
        """The agent stops its post-repair checks once the control plane has decided: the
        node is back (or gone). A repair's start stops them in ``start_repair`` itself; its
        event, delivered later, must not stop the checks that follow the repair (with an
        instant repair they have started by then, and the node was lost in VERIFYING). A
        return announced before the current checks began is an older one: they go on."""
        event = envelope.event
        if isinstance(event, NodeReturnedToService | NodeRetired):
            node = self.fleet.nodes.get(event.node_id)
            if node is not None and envelope.time > node.verify_since:
                node.verify_token += 1

    # -- faults
    def report_fault(self, node: SimNode, fault: Fault, fault_at: float) -> None:
        """Report ``fault`` after its detection delay; ``fault_at`` is the condition's
        ``since`` (when the fault happened, whoever notices it and when)."""
        fleet = self.fleet
        signal = fault.signal
        rng = fleet.model.streams.rng(DETECT_DOMAIN, node.node_id, node.faults,
                                      node.fault_reports)
        node.fault_reports += 1
        delay = fleet.sc.detection[signal.detection].sample(rng)
        if signal.heartbeat:
            delay += self.heartbeat_timeout_s
        call_later(fleet.env, delay, self._send_fault_report, node, fault, fault_at)

    def _send_fault_report(self, node: SimNode, fault: Fault, fault_at: float) -> None:
        if node.deleted or (node.fault is not fault and fault.fix != "none"):
            return  # repaired (or replaced) before anyone noticed
        self._emit_fault(node, fault, fault_at)
        if node.reporting is not fault:  # the condition persists: the agent says so again
            node.reporting = fault
            call_later(self.fleet.env, self.fleet.sc.report_interval_s, self._still_broken,
                       node, fault, fault_at)

    def _emit_fault(self, node: SimNode, fault: Fault, fault_at: float,
                    source: str | None = None) -> None:
        observed = EPOCH_S + float(self.fleet.env.now)
        self.fleet.emit(NodeHealthReported(
            node_id=node.node_id, observed_at=observed,
            conditions=fault_conditions(fault.signal, EPOCH_S + fault_at, observed,
                                        fault.cause.name),
            source=source or ("heartbeat-monitor" if fault.signal.heartbeat else "agent")),
            AGENT_SOURCE)

    def _still_broken(self, node: SimNode, fault: Fault, fault_at: float) -> None:
        """The agent's next periodic report: a fault that is still there is reported again
        (so a repair the blast-radius guard held is planned again once the guard allows it:
        without it the node was lost for the rest of the run); a transient one that has
        cleared is reported healthy, once (which releases a node held for it). During a
        repair the agent is silent and the post-repair checks report instead."""
        fleet = self.fleet
        if node.deleted or node.reporting is not fault:
            return
        if node.fault is fault:
            if not node.repairing:
                self._emit_fault(node, fault, fault_at)
            call_later(fleet.env, fleet.sc.report_interval_s, self._still_broken, node, fault,
                       fault_at)
            return
        node.reporting = None
        if fault.fix == "none" and node.fault is None and not node.repairing:
            observed = EPOCH_S + float(fleet.env.now)
            fleet.emit(NodeHealthReported(node_id=node.node_id, observed_at=observed,
                                          conditions=healthy_conditions(observed)),
                       AGENT_SOURCE)

    # -- checks after a provisioning or a repair
    def verify(self, node: SimNode) -> None:
        """Post-provision / post-repair checks: the agent reports until the node is back."""
        fleet = self.fleet
        node.verify_token += 1
        node.verify_since = EPOCH_S + float(fleet.env.now)
        call_later(fleet.env, fleet.sc.repair.verify_interval_s, self._verify_report, node,
                   node.verify_token, 1)

    def _verify_report(self, node: SimNode, token: int, n: int) -> None:
        if token != node.verify_token or node.deleted:
            return
        fleet = self.fleet
        now = float(fleet.env.now)
        observed = EPOCH_S + now
        fault = node.fault
        if fault is not None:
            if not fault.signal.empty and not fault.signal.node_down:
                fleet.emit(NodeHealthReported(
                    node_id=node.node_id, observed_at=observed,
                    conditions=fault_conditions(fault.signal, observed, observed,
                                                fault.cause.name),
                    source="post-repair-check"), AGENT_SOURCE)
            return
        if n == 1:  # the first pass of these checks: every condition first seen now
            node.passing = healthy_conditions(observed)
        fleet.emit(NodeHealthReported(node_id=node.node_id, observed_at=observed,
                                      conditions=node.passing, source="post-repair-check"),
                   AGENT_SOURCE)
        if n < self.return_after_passes + 3:
            call_later(fleet.env, fleet.sc.repair.verify_interval_s, self._verify_report, node,
                       token, n + 1)

    # -- deep checks
    def start_deep_check(self, node_id: str, attempt: int) -> None:
        """Deep checks once per (node, attempt), reporting after ``DEEP_CHECK_S``: a node
        with a fault fails DCGM level 3 (the simulated fleet's checks see its faults, as its
        post-repair checks do); a sound one passes both."""
        node = self.fleet.nodes.get(node_id)
        if node is None or (node_id, attempt) in self._deep_checks:
            return
        self._deep_checks.add((node_id, attempt))
        call_later(self.fleet.env, self.DEEP_CHECK_S, self._deep_checked, node, attempt)

    def _deep_checked(self, node: SimNode, attempt: int) -> None:
        if node.deleted:
            return
        observed = EPOCH_S + float(self.fleet.env.now)
        fault = node.fault
        failed = fault is not None and not fault.signal.empty
        dcgm = ("true", f"simulated fault: {fault.cause.name}") if failed and fault else (
            "false", "simulated node: passed")
        staged = self.staged.get(node.node_id, {})
        if self.bad_version and all(staged.get(k) == v for k, v in self.bad_version.items()):
            dcgm = ("true", "simulated: the rolled-out version fails level 3")
        details = {"deep_check_attempt": attempt}
        conditions = (
            {"type": ConditionType.DCGM_DIAG_FAILED.value, "status": dcgm[0], "reason": dcgm[1],
             "since": observed, "details": {**details, "level": 3}},
            {"type": ConditionType.COLLECTIVE_BANDWIDTH_LOW.value, "status": "false",
             "reason": "simulated node: passed", "since": observed,
             "details": {**details, "corrupt": False}},
        )
        self.fleet.emit(NodeHealthReported(node_id=node.node_id, observed_at=observed,
                                           conditions=conditions, source="deep-check"),
                        AGENT_SOURCE)
