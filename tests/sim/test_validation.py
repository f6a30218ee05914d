"""The twin against Young/Daly, the first-order waste model and Meta's ETTR model, the last
also as the study's ETTR-versus-job-size curve."""

from __future__ import annotations

import pytest

from simulator.validation import run_point, scale_points

HOUR = 3600.0


@pytest.mark.slow
def test_simulated_ettr_matches_the_analytic_models_where_they_hold() -> None:
    """16 nodes, job MTBF 8 h, ~300 failures: intervals well below the MTBF, where the
    first-order models are accurate; the twin (with its measured restart cost) agrees."""
    for interval in (600.0, 1800.0):
        p = run_point(nodes=16, job_mtbf_s=8 * HOUR, interval_s=interval, failures=300)
        assert p.interruptions > 250
        assert 150 < p.restart_s < 260  # detection + requeue + startup + restore
        assert p.sim_ettr == pytest.approx(p.meta_ettr, abs=0.01)
        assert p.sim_ettr == pytest.approx(p.first_order, abs=0.015)


@pytest.mark.slow
def test_the_best_simulated_interval_is_near_young_and_daly() -> None:
    points = [run_point(nodes=16, job_mtbf_s=2 * HOUR, interval_s=m * 60.0, failures=300)
              for m in (5, 10, 30, 60)]
    best = max(points, key=lambda p: p.sim_ettr)
    daly = points[0].daly_s
    assert best.interval_s == min((p.interval_s for p in points),
                                  key=lambda s: abs(s - daly))
    assert points[0].young_s == pytest.approx(657.3, rel=0.01)  # sqrt(2 x 30 s x 2 h)


@pytest.mark.slow
def test_the_models_underestimate_when_failures_are_frequent() -> None:
    """Interval comparable to the MTBF: the first-order models count half an interval lost
    per failure, but an attempt that fails before its first checkpoint loses only the time
    since it started; the twin keeps more than the models predict."""
    p = run_point(nodes=16, job_mtbf_s=1 * HOUR, interval_s=3600.0, failures=300)
    assert p.sim_ettr > p.meta_ettr + 0.05
    assert p.sim_ettr > p.first_order + 0.05


@pytest.mark.slow
def test_ettr_falls_with_job_size_as_the_meta_study_models_it() -> None:
    """128, 1,024 and 8,192 GPUs at 6.5 failures per 1,000 node-days (job MTTF 9.6 d, 1.2 d,
    3.6 h), a 30 min interval and 30 s saves, ~200 failures each (about 5 s in all): the twin
    within 0.02 of the model at every size, never more than 0.005 below it (the model counts
    half an interval per failure, an upper bound on what an exponential failure loses)."""
    points = scale_points((128, 1024, 8192))
    for p in points:
        assert p.interruptions > 150
        assert p.sim_ettr == pytest.approx(p.meta_ettr, abs=0.02)
        assert p.sim_ettr > p.meta_ettr - 0.005
    assert [p.sim_ettr for p in points] == sorted((p.sim_ettr for p in points), reverse=True)
    assert points[-1].sim_ettr < points[0].sim_ettr - 0.05
