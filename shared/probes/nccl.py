"""The collective bandwidth test (nccl-tests ``all_reduce_perf``) to a CollectiveBandwidthLow
condition.

A node that passes its own GPU diagnostics can still slow every job it joins: a degraded NIC,
a bad cable, a mis-set PCIe/NVLink link. ``all_reduce_perf`` across the node and a healthy
peer measures what a job would see. Its output is a table, one row per message size::

    #  size      count   type redop root   time  algbw  busbw #wrong   time  algbw  busbw #wrong
    #   (B) (elements)                     (us) (GB/s) (GB/s)          (us) (GB/s) (GB/s)
    8589934592 2147483648 float  sum   -1  47535 180.71 338.82      0  47743 179.92 337.35      0
    # Out of bounds values : 0 OK
    # Avg bus bandwidth    : 70.742

(out-of-place columns, then in-place; older releases have no ``root`` column, and ``#wrong``
is ``N/A`` without validation). Columns are found by the header's names, never by position.
The verdict reads the bus bandwidth at the largest message size (the average over all sizes is
dominated by latency-bound small messages) against ``min_busbw_gbps`` from the configuration;
any wrong value is data corruption, a failure whatever the speed. A run that hangs is a failed
check ("timeout"), like a hung dcgmi; a missing tool or output without the table is ``unknown``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shared.domain.health import Condition, ConditionType
from shared.probes.commands import CommandTimedOut, ProbeError, Runner
from shared.probes.conditions import healthy, problem, unknown

CTYPE = ConditionType.COLLECTIVE_BANDWIDTH_LOW.value
NCCL_ERROR = re.compile(r"NCCL (?:failure|error|WARN)[^\n]*", re.IGNORECASE)


class NcclParseError(ProbeError):
    pass


@dataclass(frozen=True)
class BandwidthRow:
    size_bytes: int
    busbw_oop: float  # GB/s, out-of-place
    busbw_ip: float  # GB/s, in-place
    wrong: int  # wrong values in either column; 0 when validation was off (N/A)


@dataclass(frozen=True)
class AllReduceResult:
    rows: tuple[BandwidthRow, ...]
    avg_busbw: float | None
    out_of_bounds: int | None

    @property
    def largest(self) -> BandwidthRow:
        return max(self.rows, key=lambda r: r.size_bytes)

    @property
    def busbw_gbps(self) -> float:
        """The bus bandwidth at the largest size, the better of out-of-place and in-place."""
        row = self.largest
        return max(row.busbw_oop, row.busbw_ip)

    @property
    def wrong(self) -> int:
        """Wrong values: the rows' counts, or the trailer's total when it says more."""
        return max(sum(r.wrong for r in self.rows), self.out_of_bounds or 0)


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def parse_all_reduce_perf(text: str) -> AllReduceResult:
    """Parse ``all_reduce_perf`` stdout; NcclParseError when there is no table."""
    header: list[str] | None = None
    rows: list[BandwidthRow] = []
    avg: float | None = None
    oob: int | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            body = stripped.lstrip("#").strip()
            tokens = body.split()
            if tokens[:2] == ["size", "count"] and "busbw" in tokens:
                header = tokens
            elif body.lower().startswith("avg bus bandwidth"):
                avg = _number(body.split(":", 1)[1].split()[0]) if ":" in body else None
            elif body.lower().startswith("out of bounds values"):
                value = body.split(":", 1)[1].split()[0] if ":" in body else ""
                oob = int(value) if value.isdigit() else None
            continue
        if header is None or not stripped:
            continue
        tokens = stripped.split()
        if len(tokens) != len(header) or not tokens[0].isdigit():
            continue  # a warning line between rows
        rows.append(_row(header, tokens))
    if header is None:
        raise NcclParseError("all_reduce_perf printed no result table")
    if not rows:
        raise NcclParseError("all_reduce_perf printed a header but no result rows")
    return AllReduceResult(tuple(rows), avg, oob)


def _row(header: Sequence[str], tokens: Sequence[str]) -> BandwidthRow:
    busbw = [i for i, name in enumerate(header) if name == "busbw"]
    wrong = [i for i, name in enumerate(header) if name == "#wrong"]
    values = [_number(tokens[i]) for i in busbw]
    oop, ip = [*values, None][:2]
    wrongs = [int(tokens[i]) for i in wrong if tokens[i].isdigit()]
    return BandwidthRow(int(tokens[0]), oop or 0.0, ip if ip is not None else (oop or 0.0),
                        sum(wrongs))


def bandwidth_condition(result: AllReduceResult, min_busbw_gbps: float, now: float,
                        details: dict[str, Any] | None = None) -> Condition:
    busbw = result.busbw_gbps
    info: dict[str, Any] = {
        **(details or {}),
        "busbw_gbps": busbw,
        "min_busbw_gbps": min_busbw_gbps,
        "size_bytes": result.largest.size_bytes,
        "avg_busbw_gbps": result.avg_busbw,
        "ratio_to_threshold": round(busbw / min_busbw_gbps, 4) if min_busbw_gbps > 0 else None,
        "wrong": result.wrong,
        "corrupt": result.wrong > 0,
    }
    if result.wrong > 0:
        return problem(CTYPE, now, f"all_reduce_perf: {result.wrong} wrong values (data "
                       "corruption)", info)
    if busbw < min_busbw_gbps:
        return problem(CTYPE, now, f"all_reduce_perf busbw {busbw:g} GB/s at "
                       f"{result.largest.size_bytes} B, below {min_busbw_gbps:g} GB/s", info)
    return healthy(CTYPE, now, f"all_reduce_perf busbw {busbw:g} GB/s (>= {min_busbw_gbps:g})",
                   info)


def probe(runner: Runner, now: float, argv: Sequence[str], *, min_busbw_gbps: float | None,
          timeout_s: float = 600.0, nodes: Sequence[str] = ()) -> Condition:
    """Run the test (``argv``: all_reduce_perf itself, or srun/mpirun launching it)."""
    details: dict[str, Any] = {"nodes": list(nodes), "argv": list(argv)}
    if min_busbw_gbps is None:
        return unknown(CTYPE, now, "no busbw threshold configured for this node type", details)
    try:
        result = runner(list(argv), timeout_s)
    except CommandTimedOut:
        return problem(CTYPE, now, "timeout", {**details, "timeout_s": timeout_s,
                                              "timed_out": True})
    try:
        parsed = parse_all_reduce_perf(result.stdout)
    except NcclParseError as exc:
        nccl = NCCL_ERROR.search(result.stdout + "\n" + result.stderr)
        if nccl is not None:  # NCCL itself failed between the nodes: a failed check
            return problem(CTYPE, now, f"all_reduce_perf failed: {nccl.group(0)[:200]}",
                           {**details, "exit": result.returncode})
        tail = (result.stderr.strip() or result.stdout.strip())[-200:]
        raise ProbeError(f"{exc.reason} (exit {result.returncode}): {tail}") from None
    return bandwidth_condition(parsed, min_busbw_gbps, now, details)
