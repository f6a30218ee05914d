"""The job model's sums over checkpoint cycles are the sums span by span: the same floats."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.clock import EPOCH_S
from simulator.failures import Diurnal, diurnal_integral, diurnal_spans


@settings(max_examples=300, deadline=None)
@given(amplitude=st.sampled_from([0.0, 0.015, 0.3, 1.0]), peak_hour=st.floats(0, 24),
       start=st.floats(0, 400 * 86_400.0), first=st.integers(0, 500),
       count=st.integers(0, 300), span=st.floats(0, 7_200.0),
       pause=st.floats(0, 600.0))
def test_diurnal_spans_are_the_integrals_one_by_one(
        amplitude: float, peak_hour: float, start: float, first: int, count: int, span: float,
        pause: float) -> None:
    """``diurnal_spans`` (the job model's full-speed path for many cycles at once) gives
    ``diurnal_integral`` of each cycle's compute span, bit for bit, so a run's ledger and
    checkpoint steps do not move by a rounding."""
    cfg = Diurnal(amplitude=amplitude, peak_hour=peak_hour)
    period = span + pause
    one_by_one = [diurnal_integral(cfg, c, c + span, EPOCH_S)
                  for c in (start + k * period for k in range(first, first + count))]
    assert diurnal_spans(cfg, start, first, first + count, span, period, EPOCH_S) == one_by_one
