"""Property tests: for any valid (schedule, p, m) the step simulates completely and consistently."""

from __future__ import annotations

import dataclasses

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


@st.composite
def _dualpipe_configs(draw):
    """Valid DualPipe (even pp, even m >= 2pp) and DualPipeV (m >= 2pp) configurations."""
    name = draw(st.sampled_from(["dualpipe", "dualpipev"]))
    if name == "dualpipe":
        p = 2 * draw(st.integers(1, 8))
        m = 2 * draw(st.integers(p, 32))
    else:
        p = draw(st.integers(1, 8))
        m = draw(st.integers(2 * p, 64))
    return name, p, m


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    config=_dualpipe_configs(),
    dp=st.sampled_from([1, 2]),
    tp=st.sampled_from([1, 2]),
    sends=st.sampled_from(["per_half", "after_pair"]),
    factor=st.sampled_from([1.0, 1.25]),
)
def test_dualpipe_family_simulates_consistently(config, dp, tp, sends, factor):
    name, p, m = config
    hw = dataclasses.replace(H100, overlap_sends=sends, overlap_compute_factor=factor)
    par = ParallelConfig(pp=p, microbatches=m, dp=dp, tp=tp, seq_len=64)
    run = run_schedule(name, tiny_model(), hw, par)
    check_run(run)
    again = run_schedule(name, tiny_model(), hw, par)
    assert run.result.trace.equals(again.result.trace)
