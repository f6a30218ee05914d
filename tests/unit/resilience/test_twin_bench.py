"""The trace in the twin: the same faults, scripted, scored by the same code."""

from __future__ import annotations

from shared.resilience.trace import FaultKind, load_trace
from simulator.bench_costs import RecoveryCosts


def test_the_default_trace_plays_in_the_twin() -> None:
    from services.cli.bench_twin import run

    trace = load_trace()
    result = run(trace, costs=RecoveryCosts(startup_s=1.0))
    assert [i.kind for i in result.incidents] == [f.kind.value for f in trace.faults]
    times = [i.at for i in result.incidents]
    assert times == sorted(times) and len(set(times)) == len(times)
    for inc in result.incidents:
        assert inc.detected_s is not None and inc.recovered_s is not None, inc
        assert inc.recovered_s >= 1.0  # at least the startup it was given
        assert inc.steps_lost is not None and inc.steps_lost >= 0
    lost = next(i for i in result.incidents if i.kind == FaultKind.NODE_LOST.value)
    assert lost.detected_by == "diagnosis"  # the heartbeat monitor's finding
    assert 0 < result.goodput["runtime_goodput"] < 1
