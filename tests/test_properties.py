"""Property tests: for any valid (schedule, p, m, v) the step simulates completely and consistently."""

from __future__ import annotations

import dataclasses
import warnings

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from conftest import check_run, tiny_model
from simtrain.hardware import load_profile
from simtrain.parallel import ParallelConfig
from simtrain.scenario import run_schedule
from simtrain.schedules import ScheduleWarning

H100 = load_profile("h100-sxm")


@st.composite
def valid_configs(draw):
    """(name, p, m, v) within each schedule's documented constraints, at most 64 stages."""
    name = draw(st.sampled_from(
        ["gpipe", "1f1b", "interleaved-1f1b", "looped-bfs", "interleaved-zb", "zb-h1", "zb-h2", "zbv"]))
    if name in ("interleaved-1f1b", "looped-bfs", "interleaved-zb"):
        p, v = draw(st.integers(1, 8)), draw(st.integers(1, 4))
    else:
        p, v = draw(st.integers(1, 16 if name != "zbv" else 8)), 1
    if name == "zb-h2":
        m = draw(st.integers(2 * p, 2 * p + 24))
    else:
        m = draw(st.integers(1, 48))
    if name in ("interleaved-1f1b", "interleaved-zb"):
        assume(m % max(1, m // p) == 0)  # torch's flexible rule: a multiple of its number of rounds
    return name, p, m, v


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=valid_configs(), dp=st.sampled_from([1, 2]))
def test_any_valid_config_simulates_consistently(config, dp):
    name, p, m, v = config
    par = ParallelConfig(pp=p, microbatches=m, vp=v, dp=dp, seq_len=64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ScheduleWarning)  # torch's padded ZB-V for m < 2p - 1
        run = run_schedule(name, tiny_model(), H100, par)
        again = run_schedule(name, tiny_model(), H100, par)
    check_run(run)
    assert run.result.trace.equals(again.result.trace)
    assert 0 <= run.report.span_bubble_ratio < 1


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
    tp_mode=st.sampled_from(["blocking", "hidden"]),
)
def test_dualpipe_family_simulates_consistently(config, dp, tp, sends, factor, tp_mode):
    name, p, m = config
    hw = dataclasses.replace(H100, overlap_sends=sends, overlap_compute_factor=factor, overlap_tp=tp_mode)
    par = ParallelConfig(pp=p, microbatches=m, dp=dp, tp=tp, seq_len=64)
    run = run_schedule(name, tiny_model(), hw, par)
    check_run(run)
    again = run_schedule(name, tiny_model(), hw, par)
    assert run.result.trace.equals(again.result.trace)
