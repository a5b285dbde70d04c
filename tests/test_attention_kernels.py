"""Fused-attention kernels told apart: each GPU kind's measured kernels and its default (what the
common framework picks there), a run's ``attention_kernel`` choosing among them, the backward at
2.5x the forward's FLOPs (FlashAttention's count), and one error line for a kernel a kind lacks."""

from __future__ import annotations

import copy

import pytest

from simtrain.costs.attention_rates import BACKWARD_FLOPS_PER_FORWARD
from simtrain.costs.kernels import OP_DATA, kernel_rates, parse_op_data, rates_for
from simtrain.costs.ops import _Ctx, _attention, ops_runtime, parse_recompute
from simtrain.errors import SimtrainError, load_yaml_file
from simtrain.hardware import TFLOPS, load_profile
from simtrain.models import load_model
from simtrain.parallel import ParallelConfig
from simtrain.scenario import run_schedule


def _attention_row(hw: str = "h100-sxm", **par):
    """The fused attention operator of one Llama 3 8B layer on ``hw`` (seq 4096, TP 1)."""
    m, h = load_model("llama3-8b"), load_profile(hw)
    p = ParallelConfig(**{"microbatches": 1, "seq_len": 4096, **par})
    r = rates_for(h)
    ctx = _Ctx(m, p, r, "flash", h.hbm_bandwidth_bytes_per_s * r.hbm_efficiency, parse_recompute(p.recompute))
    (row,) = _attention(ctx)
    return row, r


def test_each_kind_defaults_to_what_its_common_framework_picks():
    """sm_90: Transformer Engine prefers cuDNN's FusedAttention on Hopper, and torch SDPA does too
    with cuDNN > 9.15; sm_80: FlashAttention-2 (both frameworks); sm_100: its only measured kernel."""
    assert (kernel_rates("sm_90").attention_default, sorted(kernel_rates("sm_90").attention)) == \
        ("cudnn", ["cudnn", "fa2", "fa3"])
    assert (kernel_rates("sm_80").attention_default, sorted(kernel_rates("sm_80").attention)) == ("fa2", ["fa2"])
    assert kernel_rates("sm_100").attention_default == "fa4"
    assert kernel_rates("gfx942").attention == {} and kernel_rates("gfx942").attention_default is None


def test_cudnn_rates_are_the_fa3_papers_causal_forward_and_measured_backward_ratio():
    """FA3 paper, H100, head dim 128: cuDNN causal forward 518 TFLOP/s at 4k; backward 499 against a
    non-causal forward of 609 there, so its causal backward is 518 x 499 / 609."""
    r = kernel_rates("sm_90")
    assert r.attention_flops_per_s(4096, 128, kernel="cudnn") == pytest.approx(518 * TFLOPS)
    assert r.attention_flops_per_s(4096, 128, kernel="cudnn", backward=True) == pytest.approx(518 * 499 / 609 * TFLOPS)
    between = r.attention_flops_per_s(3000, 128, kernel="cudnn")  # log-interpolated between 2k and 4k
    assert 484 * TFLOPS < between < 518 * TFLOPS
    assert r.attention_flops_per_s(100_000, 128, kernel="fa3") == pytest.approx(616 * TFLOPS)  # clamped above 16k
    # FA2: the same paper's FlashAttention-2 curves (causal 319 at 4k; backward 310 against 368)
    fa2 = r.attention_flops_per_s(4096, 128, kernel="fa2")
    assert fa2 == pytest.approx(319 * TFLOPS)
    assert r.attention_flops_per_s(4096, 128, kernel="fa2", backward=True) == pytest.approx(fa2 * 310 / 368)
    assert r.attention_flops_per_s(4096, 128) == r.attention_flops_per_s(4096, 128, kernel="cudnn")  # the default


@pytest.mark.parametrize("kernel", ["fa2", "cudnn", "fa3"])
def test_attention_backward_is_two_and_a_half_forwards_of_work_at_the_backward_rate(kernel):
    """Dao 2023 §3.1: the backward runs five matrix products to the forward's two; the measured
    backward TFLOP/s are in that count, so its seconds are 2.5 x work / backward rate."""
    row, r = _attention_row(attention_kernel=kernel)
    fwd_s, bwd_s, w_s = row.seconds
    ratio = r.attention_flops_per_s(4096, 128, kernel=kernel) / r.attention_flops_per_s(4096, 128, kernel=kernel, backward=True)
    assert bwd_s / fwd_s == pytest.approx(BACKWARD_FLOPS_PER_FORWARD * ratio) and w_s == 0
    assert row.flops[1] == 2 * row.flops[0]  # the FLOPs simtrain counts for MFU are unchanged


def test_the_kernel_choice_moves_only_the_attention_row_and_the_default_is_cudnn_on_h100():
    fa2, _ = _attention_row(attention_kernel="fa2")
    cudnn, _ = _attention_row(attention_kernel="cudnn")
    default, _ = _attention_row()
    assert default.seconds == cudnn.seconds
    assert cudnn.flops == fa2.flops and sum(cudnn.seconds) < sum(fa2.seconds)
    m, h = load_model("llama3-8b"), load_profile("h100-sxm")
    runs = {}
    for k in ("fa2", "cudnn"):
        p = ParallelConfig(pp=2, microbatches=4, seq_len=4096, attention_kernel=k)
        runs[k] = run_schedule("1f1b", m, h, p, runtime=ops_runtime(m, p, h)).report.step_time_s
    assert runs["cudnn"] < runs["fa2"]


def test_a_kernel_the_kind_lacks_or_an_unfused_attention_is_refused_in_one_line():
    m, a100 = load_model("llama3-8b"), load_profile("a100-sxm-80gb")
    p = ParallelConfig(pp=2, microbatches=4, attention_kernel="fa3")
    with pytest.raises(SimtrainError, match=r"--attention-kernel fa3: .* GPU kind sm_80; measured: fa2$"):
        ops_runtime(m, p, a100)
    h100 = load_profile("h100-sxm")
    with pytest.raises(SimtrainError, match="--attention-kernel fa3: names a fused-attention kernel, and attention is unfused"):
        ops_runtime(m, p, h100, "unfused")


def test_the_cli_takes_the_flag_and_refuses_it_with_the_flat_model():
    from conftest import SMALL, invoke

    ok = invoke("compare", *SMALL, "--schedules", "1f1b", "--json", "--attention-kernel", "fa2")
    assert ok.exit_code == 0, ok.output
    for extra, said in ((["--cost-model", "flat"], "flat cost model runs here"),
                        (["--hardware", "a100-sxm-80gb"], "measured: fa2"), ([], "Input should be")):
        res = invoke("compare", *SMALL, "--schedules", "1f1b", "--json", "--attention-kernel",
                     "fa2" if extra and extra[0] == "--cost-model" else "fa3" if extra else "fa9", *extra)
        assert res.exit_code == 2 and res.output.count("error:") == 1 and said in res.output, res.output


@pytest.mark.parametrize("edit, said", [
    (lambda a: a.update(default="fa3"), "default = 'fa3': must name one of its kernels"),
    (lambda a: a["kernels"].update(flash9=a["kernels"]["fa2"]), "'flash9' is not a fused-attention kernel"),
    (lambda a: a["kernels"]["fa2"].pop("backward"), "needs backward (measured pairs) or a backward_ratio"),
    (lambda a: a["kernels"]["cudnn"]["backward"][0].update(backward_tflops=0), "backward_tflops must be > 0"),
])
def test_bad_attention_tables_are_one_error_naming_the_field(edit, said):
    data = copy.deepcopy(load_yaml_file(OP_DATA))
    att = data["kinds"]["sm_90"]["attention"]
    if "fa3" in att["kernels"] and said.startswith("default"):
        del att["kernels"]["fa3"]
    edit(att)
    with pytest.raises(SimtrainError, match="t.yaml: kinds.sm_90.attention") as e:
        parse_op_data(data, "t.yaml")
    assert said in str(e.value)
