"""The SMs that EP dispatch / combine kernels take from the compute they overlap
(:mod:`simtrain.costs.ep_sms`): the factor's arithmetic, which schedules it touches, and bad input."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from pydantic import ValidationError

from conftest import balanced_moe, check_run, invoke, tiny_model
from simtrain.costs.ep_sms import bound_fractions, ep_slowdown, item_factor
from simtrain.costs.ops import OpCost, ops_runtime
from simtrain.errors import SimtrainError
from simtrain.hardware import load_profile
from simtrain.parallel import ParallelConfig
from simtrain.scenario import run_schedule

H800 = load_profile("h800")
PAR = ParallelConfig(pp=4, dp=8, ep=8, microbatches=8, zero_stage=1)


def test_profiles_carry_datasheet_sm_counts():
    assert {n: load_profile(n).sms for n in ("h800", "h100-sxm", "h100-pcie", "a100-sxm-80gb", "b200")} == {
        "h800": 132, "h100-sxm": 132, "h100-pcie": 114, "a100-sxm-80gb": 108, "b200": 148}


def test_slowdown_arithmetic():
    assert ParallelConfig().ep_comm_sms == 20  # DeepEP's Buffer.num_sms
    assert ep_slowdown(H800, PAR) == pytest.approx(132 / 112) == pytest.approx(1.178571, abs=1e-6)
    assert ep_slowdown(H800, PAR.model_copy(update=dict(ep_comm_sms=66))) == pytest.approx(2.0)
    assert ep_slowdown(H800, PAR.model_copy(update=dict(ep_comm_sms=0))) == 1.0
    assert ep_slowdown(H800, PAR.model_copy(update=dict(ep=1))) == 1.0  # no all-to-all
    assert ep_slowdown(replace(H800, sms=None), PAR) == 1.0  # a profile that does not say
    # 3 s compute-bound + 1 s memory-bound at 132 / 112: 3 x 1.1786 + 1 = 4.5357 s of 4
    assert 4 * item_factor(132 / 112, 0.75) == pytest.approx(3 * 132 / 112 + 1)
    assert item_factor(1.5, 0.0) == 1.0 and item_factor(1.5, 1.0) == 1.5


def test_bound_fractions_count_compute_bound_seconds_per_pass():
    gemm = OpCost("qkv", (1.0,) * 3, (1.0,) * 3, (3.0, 6.0, 2.0), "compute")
    norm = OpCost("norm", (0.0,) * 3, (1.0,) * 3, (1.0, 2.0, 0.0), "memory")
    (f_seg, f_exp), (i_seg, _), (b_seg, _) = bound_fractions([gemm, norm], [gemm])
    assert (f_seg, f_exp, i_seg) == (0.75, 1.0, 0.75)
    assert b_seg == pytest.approx(8 / 10)  # B: I and W together
    assert bound_fractions([], []) == ((1.0, 1.0),) * 3


def _step(schedule, model, parallel, hw=H800, runtime=None):
    run = run_schedule(schedule, model, hw, parallel, runtime=runtime)
    check_run(run, contiguous=False)
    return run.report.step_time_s


@pytest.mark.parametrize("schedule", ["dualpipev", "dualpipe", "1f1b-overlap", "1f1b+waved-ep", "dualpipev+waved-ep"])
def test_overlapped_ep_schedules_slow_down(schedule):
    model, off = balanced_moe(layers=9), PAR.model_copy(update=dict(ep_comm_sms=0))
    slow, plain = _step(schedule, model, PAR), _step(schedule, model, off)
    assert plain < slow < plain * 132 / 112 + 1e-12  # compute slows by at most S / (S - s)


def test_serial_ep_and_dense_runs_are_unchanged():
    model, off = balanced_moe(layers=9), PAR.model_copy(update=dict(ep_comm_sms=0))
    assert _step("1f1b", model, PAR) == _step("1f1b", model, off)  # nothing beside compute
    dense, dp = tiny_model(layers=8), ParallelConfig(pp=4, dp=2, microbatches=8)
    assert _step("dualpipev", dense, dp) == _step("dualpipev", dense, dp.model_copy(update=dict(ep_comm_sms=0)))


def test_pair_compute_scales_by_the_per_operator_fraction():
    """Under the per-operator model a pair's compute grows by less than S / (S - s): its
    memory-bound kernels keep their time."""
    model = balanced_moe(layers=9)
    off = PAR.model_copy(update=dict(ep_comm_sms=0))
    runs = {p.ep_comm_sms: run_schedule("dualpipev", model, H800, p, runtime=ops_runtime(model, p, H800))
            for p in (PAR, off)}
    seg, exp = next(c.moe for c in runs[20].costs.chunks if c.moe).bound_fraction[0]
    assert 0.5 < seg < 1.0 and 0.5 < exp <= 1.0

    def compute_s(run):
        t = run.result.trace
        return (t.loc[t["category"] == "compute", "end_s"] - t.loc[t["category"] == "compute", "start_s"]).sum()

    ratio = compute_s(runs[20]) / compute_s(runs[0])
    assert 1.0 < ratio < 132 / 112


def test_bad_ep_comm_sms_is_refused():
    with pytest.raises(ValidationError):
        ParallelConfig(ep_comm_sms=-1)
    with pytest.raises(SimtrainError, match="parallel.ep_comm_sms = 132: must be below the 132 SMs"):
        run_schedule("dualpipev", balanced_moe(layers=9), H800, PAR.model_copy(update=dict(ep_comm_sms=132)))


@pytest.mark.parametrize("value, message", [(-1, "field 'parallel.ep_comm_sms' = -1"),
                                            (132, "parallel.ep_comm_sms = 132: must be below the 132 SMs"),
                                            ("many", "field 'parallel.ep_comm_sms' = 'many'")])
def test_bad_ep_comm_sms_in_a_scenario_is_one_error_line(tmp_path, value, message):
    path = tmp_path / "s.yaml"
    path.write_text("model: mixtral-8x7b\nhardware: h800\nschedules: [dualpipev]\n"
                    f"parallel: {{pp: 2, dp: 8, ep: 8, microbatches: 4, ep_comm_sms: {value}}}\n")
    res = invoke("compare", str(path), "--json")
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0]


def test_a_profile_with_a_bad_sm_count_is_one_error_line(tmp_path):
    text = (Path(__file__).resolve().parent.parent / "simtrain/hardware_profiles/h800.yaml").read_text()
    path = tmp_path / "hw.yaml"
    path.write_text(text.replace("\nsms: 132", "\nsms: 0"))
    res = invoke("compare", "--model", "mixtral-8x7b", "--hardware", str(path), "--pp", "2", "--dp", "8",
                 "--ep", "8", "--microbatches", "4", "--schedules", "dualpipev")
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "field 'sms' = 0" in lines[0]
