"""Property tests: for any valid (schedule, p, m) the step simulates completely and consistently."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import check_run, tiny_model
from simtrain.hardware import load_profile
from simtrain.parallel import ParallelConfig
from simtrain.scenario import run_schedule

H100 = load_profile("h100-sxm")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(["gpipe", "1f1b"]),
    p=st.integers(1, 16),
    m=st.integers(1, 64),
    dp=st.sampled_from([1, 2]),
)
def test_any_valid_config_simulates_consistently(name, p, m, dp):
    par = ParallelConfig(pp=p, microbatches=m, dp=dp, seq_len=64)
    run = run_schedule(name, tiny_model(), H100, par)
    check_run(run)
    again = run_schedule(name, tiny_model(), H100, par)
    assert run.result.trace.equals(again.result.trace)
