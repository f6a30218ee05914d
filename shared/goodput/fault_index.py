"""Where the goodput accounting looks an attempt's disruption up: the fleet's fault reports
by time and by node (and a job's own, for one job of many), and a job's drains by time.

An attempt asks for the first report that ended it and the first drain in its window; with
hundreds of attempts, thousands of reports and hundreds of drains, each answer is a bisection
into these indexes, not a pass over the log.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import defaultdict
from collections.abc import Container, Iterable, Mapping
from typing import Protocol


class Span(Protocol):
    """An attempt as the indexes see it: when it started, and its nodes."""

    @property
    def start(self) -> float: ...
    @property
    def node_ids(self) -> tuple[str, ...]: ...
    @property
    def members(self) -> frozenset[str]: ...


NON_FATAL_TYPES = frozenset({"SlowSpeedCheck", "ThermalThrottling", "DiskPressure"})


Report = tuple[float, str, str, str]  # (fault time, node, cause, condition type)


class Reports:
    """The fleet's fault reports, in (time, node, ...) order and by node: an attempt asks
    for its first report that counts, from whichever is smaller, the reports in its window
    (a fleet of 128 jobs has many) or its members' own (a 2,048-node job has many members)."""

    def __init__(self, reports: list[Report]) -> None:
        self.all = sorted(reports)
        self.by_node: dict[str, list[Report]] = defaultdict(list)
        for found in self.all:  # each node's in the same order
            self.by_node[found[1]].append(found)

    def of(self, node_ids: Iterable[str]) -> Reports:
        """The reports of ``node_ids`` alone, in the same order: a 128-node job of a
        131,072-GPU fleet finds each attempt's reports in its own few, not in the fleet's
        window (thousands) or by a lookup per member (128 an attempt, 22,000 attempts)."""
        view = Reports([])
        view.by_node.update((n, self.by_node[n]) for n in node_ids if n in self.by_node)
        view.all = sorted(itertools.chain.from_iterable(view.by_node.values()))
        return view

    def first(self, att: Span, horizon: float,
              diagnoses: Mapping[str, list[tuple[float, str]]]) -> Report | None:
        started = att.start
        lo = bisect.bisect_left(self.all, (started,))
        hi = bisect.bisect_right(self.all, (horizon, "\U0010ffff"), lo=lo)
        if 8 * (hi - lo) <= len(att.node_ids):  # (a report scanned costs about 8 members)
            # a handful of reports: each looked up in the ranks (a scan in C) rather than
            # building the set of 2,048 members for them
            members = att.node_ids if hi - lo <= SCAN_RANKS_UP_TO else att.members
            return first_counted(itertools.islice(self.all, lo, hi), members, started,
                                  diagnoses)
        first: Report | None = None
        for node_id in att.members & self.by_node.keys():
            mine = self.by_node[node_id]
            found = first_counted(itertools.islice(mine, bisect.bisect_left(mine, (started,)),
                                                    None), None, started, diagnoses, horizon)
            if found is not None and (first is None or found < first):
                first = found
        return first


SCAN_RANKS_UP_TO = 4  # reports in an attempt's window looked up in its ranks, not a set


def first_counted(reports: Iterable[Report], members: Container[str] | None, started: float,
                   diagnoses: Mapping[str, list[tuple[float, str]]],
                   horizon: float = math.inf) -> Report | None:
    """The first of ``reports`` (in order) on a member that ends a job: after the start, not
    a slow/hot/full warning, and acted on by triage."""
    for found in reports:
        since, node_id = found[0], found[1]
        if since > horizon:
            return None
        if (members is not None and node_id not in members) or since <= started:
            continue  # (a fault at the very instant it started is the previous attempt's)
        if found[3] in NON_FATAL_TYPES:
            continue  # slow, hot or full: the job goes on until it is drained (a signal)
        node_diagnoses = diagnoses.get(node_id, [])
        if node_diagnoses and not diagnosed_within(node_diagnoses, since):
            continue  # triage found nothing to act on (a lone XID 45): the job went on
        return found
    return None


DIAGNOSIS_WINDOW_S = 6 * 3600.0  # a fault's diagnosis follows its report within this


def diagnosed_within(diagnoses: list[tuple[float, str]], since: float) -> bool:
    """Triage acted on something the node reported at ``since`` (it emits a diagnosis only
    for what needs an action: a benign report leaves none)."""
    i = bisect.bisect_left(diagnoses, (since, ""))
    return i < len(diagnoses) and diagnoses[i][0] <= since + DIAGNOSIS_WINDOW_S


class Drains:
    """A job's drains (time, reason) in time order, the log's order among equal times."""

    def __init__(self, drains: list[tuple[float, str]]) -> None:
        self.by_time = sorted(drains, key=lambda d: d[0])  # (stable)
        self.times = [t for t, _ in self.by_time]
