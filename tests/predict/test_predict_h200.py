"""Predicted against measured on a real H200 sweep (tests/data/predict_h200_llama8b_agg): each
point predicted from the run's other points must stay within issue 50's goals."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.predict.holdout import leave_one_out, median_abs_error
from harness.predict.limits import DEFAULT
from harness.predict.observe import observations

RUN = Path(__file__).parents[1] / "data" / "predict_h200_llama8b_agg"
pytestmark = pytest.mark.timeout(300)


def test_held_out_h200_points_meet_the_issues_goals() -> None:
    obs = observations(RUN)
    # The precondition: the whole sweep, both shapes, every concurrency, one serving.
    assert len(obs) == 14 and {o.isl for o in obs} == {1024, 4096} and {o.phase for o in obs} == {"agg"}
    checked = leave_one_out(obs, RUN, {"agg": DEFAULT})  # the run set neither engine limit
    assert all(c.predicted is not None for c in checked)
    per_gpu = median_abs_error(checked, "output_tps_per_gpu")
    ttft = median_abs_error(checked, "p90_ttft_ms")
    tpot = median_abs_error(checked, "mean_tpot_ms")
    # Measured when written: 5.1 %, 10.9 % and 4.3 % (docs/predict.md); goals 10 % and 20 %.
    assert per_gpu is not None and per_gpu <= 0.10
    assert ttft is not None and ttft <= 0.20
    assert tpot is not None and tpot <= 0.10
    # Beyond the profiled decode batch, the prediction says so.
    top = next(c for c in checked if c.observed.concurrency == 64 and c.observed.isl == 4096)
    assert top.predicted is not None and any("decode batch" in x for x in top.predicted.extrapolating)
