"""The per-operator cost model: GEMM-table interpolation, the roofline terms, breakdowns that add
up to a stage's F/I/W, unit costs untouched, and one error line for bad kernel tables."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from simtrain.costs.kernels import OP_DATA, kernel_rates, parse_op_data, rates_for
from simtrain.costs.ops import _Ctx, chunk_breakdown, ops_runtime, parse_recompute
from simtrain.errors import SimtrainError, load_yaml_file
from simtrain.hardware import TFLOPS, load_profile
from simtrain.models import load_model
from simtrain.parallel import ParallelConfig
from simtrain.scenario import run_schedule


def test_gemm_rate_is_the_table_at_its_points_saturates_above_and_falls_below():
    r = kernel_rates("sm_90")
    table = load_yaml_file(OP_DATA)["kinds"]["sm_90"]["gemm"]["tflops"]["bf16"]
    one = table[0]
    assert r.gemm_flops_per_s(4096, 4096, 4096, "bf16") == pytest.approx(one[4][4][4] * TFLOPS)
    assert r.gemm_flops_per_s(1024, 2048, 512, "bf16") == pytest.approx(one[2][3][1] * TFLOPS)
    assert r.gemm_flops_per_s(16384, 53248, 16384, "bf16") == pytest.approx(one[4][4][4] * TFLOPS)
    mid = r.gemm_flops_per_s(1448, 4096, 4096, "bf16")  # between m = 1024 and 2048
    assert one[2][4][4] * TFLOPS <= mid <= one[3][4][4] * TFLOPS
    assert r.gemm_flops_per_s(128, 4096, 4096, "bf16") == pytest.approx(one[0][4][4] * TFLOPS / 2)
    # a batched call: the table's b = 4 plane, and no further gain past it
    assert r.gemm_flops_per_s(2048, 2048, 256, "bf16", batch=4) == pytest.approx(table[2][3][3][0] * TFLOPS)
    assert r.gemm_flops_per_s(2048, 2048, 256, "bf16", batch=96) == pytest.approx(table[2][3][3][0] * TFLOPS)


def test_a100_borrows_the_shape_curve_scaled_to_its_measured_maximum():
    a100 = kernel_rates("sm_80")
    assert a100.gemm["bf16"][0].max() == pytest.approx(267.9 * TFLOPS)
    h100 = kernel_rates("sm_90")
    ratio = a100.gemm["bf16"] / h100.gemm["bf16"]
    assert np.allclose(ratio, ratio.flat[0])


@pytest.mark.parametrize("profile", ["h100-sxm", "h200-sxm", "h800", "a100-sxm-80gb", "b200"])
def test_no_gemm_rate_exceeds_the_profiles_dense_peak(profile):
    """A dense GEMM cannot beat the datasheet peak: OpenXLA's sm_90 FP8 entries (up to 2621 TFLOP/s,
    H100 SXM's dense FP8 peak is 1978.9) and its f32 entries (403, a TF32 rate) did."""
    hw = load_profile(profile)
    rates = rates_for(hw)
    for dtype, table in rates.gemm.items():
        if dtype in hw.peak_flops:
            assert table.max() <= hw.peak_flops[dtype], (profile, dtype)
    assert rates_for(hw).gemm_flops_per_s(8192, 8192, 8192, "bf16") < hw.peak_flops["bf16"]


def test_h100_fp8_is_the_bf16_shape_curve_scaled_to_the_measured_fp8_maximum():
    """stas00/ml-engineering MAMF table: H100 SXM float8_e4m3fn 1402.6 TFLOP/s (single GEMM, b = 1)."""
    h100 = kernel_rates("sm_90")
    assert h100.gemm["fp8"][0].max() == pytest.approx(1402.6 * TFLOPS)
    ratio = h100.gemm["fp8"] / h100.gemm["bf16"]
    assert np.allclose(ratio, ratio.flat[0])
    data = copy.deepcopy(load_yaml_file(OP_DATA))
    del data["kinds"]["sm_90"]["gemm"]["tflops"]["bf16"]
    with pytest.raises(SimtrainError, match="mamf_tflops: scales the kind's bf16 table"):
        parse_op_data(data, "t.yaml")


def _ctx(model="llama3-8b", hw="h100-sxm", attention="flash", **par):
    m, h = load_model(model), load_profile(hw)
    p = ParallelConfig(**{"tp": 2, "pp": 2, "microbatches": 4, "seq_len": 2048, **par})
    r = rates_for(h)
    return m, p, h, _Ctx(m, p, r, attention, h.hbm_bandwidth_bytes_per_s * r.hbm_efficiency,
                         parse_recompute(p.recompute))


@pytest.mark.parametrize("attention", ["flash", "unfused"])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_breakdown_adds_up_to_the_stage_seconds_the_simulator_runs(attention, recompute):
    m, p, h, ctx = _ctx(attention=attention, recompute=recompute)
    run = run_schedule("1f1b", m, h, p, runtime=ops_runtime(m, p, h, attention))
    for c in run.costs.chunks:
        ops = chunk_breakdown(ctx, c.layers, c.has_embedding, c.has_head, c.params)
        assert sum(o.seconds[0] for o in ops) == pytest.approx(c.forward_s)
        assert sum(o.seconds[1] for o in ops) == pytest.approx(c.backward_input_s)
        assert sum(o.seconds[2] for o in ops) == pytest.approx(c.backward_weight_s)
        names = {o.name for o in ops}
        assert {"qkv", "attn_out", "ffn_up", "ffn_down", "norm", "activation", "residual", "rotary"} <= names
        assert ("attention" in names) == (attention == "flash")
        assert ("softmax" in names) == (attention == "unfused")
        assert ("head:lm_head" in names) == c.has_head and ("embedding" in names) == c.has_embedding
        rec = next(o for o in ops if o.name == "recompute").seconds[1]
        assert (rec > 0) == (recompute != "none")
        if recompute == "full":
            layer_f = sum(o.seconds[0] for o in ops if not o.name.startswith("head:") and o.name != "embedding")
            assert rec == pytest.approx(layer_f)


def test_memory_bound_kernels_cost_time_and_gemm_terms_are_rooflines():
    m, p, h, ctx = _ctx()
    ops = {o.name: o for o in chunk_breakdown(ctx, (0, 1), True, False, 1e8)}
    bw = ctx.hbm_bytes_per_s
    assert ops["norm"].seconds[0] == pytest.approx(ops["norm"].bytes[0] / bw) and ops["norm"].seconds[0] > 0
    qkv = ops["qkv"]
    assert qkv.seconds[0] >= qkv.flops[0] / (h.peak_flops["bf16"]) and qkv.bound == "compute"
    # two layers of one shape are exactly twice one layer
    one = {o.name: o for o in chunk_breakdown(ctx, (0,), False, False, 0.0)}
    assert ops["ffn_up"].seconds[2] == pytest.approx(2 * one["ffn_up"].seconds[2])


def test_op_times_pass_through_unchanged():
    m, p, h, _ = _ctx()
    plain = run_schedule("1f1b", m, h, p, op_times=(1.0, 1.0, 1.0))
    ops = run_schedule("1f1b", m, h, p, op_times=(1.0, 1.0, 1.0), runtime=ops_runtime(m, p, h))
    assert ops.report.step_time_s == plain.report.step_time_s
    assert [c.forward_s for c in ops.costs.chunks] == [1.0, 1.0]


def _bad(mutate):
    data = copy.deepcopy(load_yaml_file(OP_DATA))
    mutate(data)
    with pytest.raises(SimtrainError) as exc:
        parse_op_data(data, "t.yaml")
    return str(exc.value)


def test_bad_kernel_tables_are_one_error_naming_the_field():
    def nonmono(d):
        d["kinds"]["sm_90"]["gemm"]["tflops"]["bf16"][0][4][4][4] = 1.0

    def negative(d):
        d["kinds"]["sm_90"]["gemm"]["tflops"]["bf16"][0][0][0][0] = -1.0

    assert "non-monotone" in _bad(nonmono) and "sm_90" in _bad(nonmono)
    assert "positive" in _bad(negative)
    assert "shape" in _bad(lambda d: d["kinds"]["sm_90"]["gemm"]["tflops"]["bf16"].pop())
    assert "batches" in _bad(lambda d: d.update(batches=[4, 1]))
    assert "borrow" in _bad(lambda d: d["kinds"]["sm_80"]["gemm"].update(borrow="sm_7x"))
    assert "mamf_tflops" in _bad(lambda d: d["kinds"]["sm_80"]["gemm"]["mamf_tflops"].update(bf16=0))
    with pytest.raises(SimtrainError, match="no GEMM table for dtype fp64"):
        kernel_rates("sm_90").gemm_flops_per_s(1024, 1024, 1024, "fp64")
    with pytest.raises(SimtrainError, match="attention"):
        ops_runtime(*_ctx()[:3], attention="naive")


def test_recompute_by_module_reruns_exactly_those_operators():
    m, p, h, ctx = _ctx(recompute="none")
    base = {o.name: o for o in chunk_breakdown(ctx, (0,), False, False, 0.0)}
    import dataclasses
    mod = dataclasses.replace(ctx, recompute=parse_recompute("norm,swiglu"))
    rec = next(o for o in chunk_breakdown(mod, (0,), False, False, 0.0) if o.name == "recompute")
    assert rec.seconds[1] == pytest.approx(base["norm"].seconds[0] + base["activation"].seconds[0])
    assert rec.flops[1] == 0.0  # memory-bound kernels: no FLOPs, so HFU = MFU here
    assert parse_recompute("mla_up,attn_core") >= {"q_up", "kv_up", "softmax", "attention"}
    with pytest.raises(SimtrainError, match="unknown module 'mlp_up'"):
        parse_recompute("norm,mlp_up")


def test_fp8_gemms_speed_up_linear_layers_only():
    m, p, h, _ = _ctx()
    bf16 = run_schedule("1f1b", m, h, p, runtime=ops_runtime(m, p, h))
    fp8 = run_schedule("1f1b", m, h, p, runtime=ops_runtime(m, p, h, fp8="gemms"))
    assert fp8.costs.chunks[0].forward_s < bf16.costs.chunks[0].forward_s
    with pytest.raises(SimtrainError, match="no FP8 GEMM table"):
        ma, pa, ha, _ = _ctx(hw="a100-sxm-80gb")
        ops_runtime(ma, pa, ha, fp8="gemms")
    with pytest.raises(SimtrainError, match="--fp8"):
        ops_runtime(m, p, h, fp8="all")


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_hfu_counts_recomputation_and_equals_mfu_without_it(recompute):
    from simtrain.cost_models import step_hfu

    m, p, h, _ = _ctx(recompute=recompute)
    rt = ops_runtime(m, p, h)
    run = run_schedule("1f1b", m, h, p, runtime=rt)
    hfu = step_hfu(run, rt)
    if recompute == "none":
        assert hfu == pytest.approx(run.report.mfu)
    else:  # the forward rerun: between 1 and 4/3 of the model FLOPs (the head is not rerun)
        assert 1.2 * run.report.mfu < hfu < 4 / 3 * run.report.mfu


def test_flash_attention_stores_no_scores_unfused_stores_them_unless_recomputed():
    """FlashAttention keeps only the fp32 log-sum-exp per query row and head (Dao 2023, Alg. 1),
    so with recompute none it stores (nearly) what selective does; unfused attention also stores
    the a x s score matrix per token (Korthikanti et al. 2022 §4.1)."""
    from simtrain.costs import stage_costs

    m, h = load_model("llama3-8b"), load_profile("h100-sxm")
    s, tp = 4096, 2

    def act(**kw):
        p = ParallelConfig(tp=tp, pp=2, microbatches=4, seq_len=s, **kw)
        return sum(c.activation_bytes for c in stage_costs(m, p, h, 2).chunks), p

    sel, _ = act(recompute="selective")
    flash, p = act(recompute="none", attention="flash")
    unfused, _ = act(recompute="none", attention="unfused")
    assert act(recompute="selective", attention="unfused")[0] == sel
    tokens = s * p.microbatch_size
    assert flash - sel == pytest.approx(m.num_layers * tokens * 4 * m.num_heads / tp)
    assert unfused - sel == pytest.approx(m.num_layers * tokens * m.num_heads * s * 2 / tp)


def test_eager_kernels_move_the_bytes_counted_from_torchtitans_ops():
    """kernels: eager (torchtitan without torch.compile): an RMSNorm in bf16 moves 36 bytes per
    element forward (cast 6, pow 8, mean 4, mul 8, cast 6, weight 4) against the fused 4; in fp32
    the casts vanish; GEMMs and attention are untouched and the breakdown still adds up."""
    from simtrain.costs.ops import eager_factors

    assert eager_factors("norm", 2) == (9.0, pytest.approx(56 / 6))
    assert eager_factors("rotary", 4) == (1.0, 1.0) and eager_factors("qkv", 2) == (1.0, 1.0)
    assert eager_factors("activation", 2, "gelu") == (1.0, 1.0)
    m, p, h, fused = _ctx()
    _, pe, _, eager = _ctx(kernels="eager")
    a, b = (chunk_breakdown(c, (0,), False, False, 0.0) for c in (fused, eager))
    rows_a, rows_b = {o.name: o for o in a}, {o.name: o for o in b}
    assert rows_b["norm"].bytes[0] == pytest.approx(9 * rows_a["norm"].bytes[0])
    assert rows_b["qkv"].seconds == rows_a["qkv"].seconds and rows_b["attention"].seconds == rows_a["attention"].seconds
    run = run_schedule("1f1b", m, h, pe, runtime=ops_runtime(m, pe, h))
    for c in run.costs.chunks:
        ops = chunk_breakdown(ops_runtime(m, pe, h).ctx, c.layers, c.has_embedding, c.has_head, c.params)
        assert sum(o.seconds[0] for o in ops) == pytest.approx(c.forward_s)


def test_eager_kernels_under_the_flat_model_are_refused():
    from conftest import SMALL, invoke

    res = invoke("compare", *SMALL, "--schedules", "1f1b", "--json", "--kernels", "eager", "--cost-model", "flat")
    assert res.exit_code == 2 and res.output.count("error:") == 1 and "--kernels eager" in res.output


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_fused_attention_never_beats_the_compute_dtypes_peak_and_mfu_stays_below_one(dtype):
    """FlashAttention's table is 16-bit: in fp32 its rate falls with the GEMM tables' fp32/bf16
    ratio (a review found 557 TFLOP/s fp32 attention on H100 and MFU 107 %)."""
    m, h = load_model("llama3-8b"), load_profile("h100-sxm")
    rates = rates_for(h)
    for s in (512, 4096, 16384):
        assert rates.attention_flops_per_s(s, 128, dtype) <= h.peak_flops[dtype]
    assert rates.attention_flops_per_s(4096, 128, "fp8") == rates.attention_flops_per_s(4096, 128, "bf16")
    p = ParallelConfig(tp=8, microbatches=4, dtype=dtype)
    run = run_schedule("1f1b", m, h, p, runtime=ops_runtime(m, p, h))
    assert 0 < run.report.mfu < 1


def test_b200_prices_flash_attention_at_its_measured_fused_rate_and_a_kind_without_one_is_warned():
    """B200 has FA4's measured forward rates (flash-attention PR #2605): flash attention is one
    fused operator there, faster than the unfused products, and no warning is given. MI300X's kind
    has no measured fused-attention rate: it is priced unfused, and the run says so."""
    import warnings

    from simtrain.schedules.ir import ScheduleWarning

    m, h = load_model("llama3-8b"), load_profile("b200")
    rates = rates_for(h)
    assert rates.attention_flops_per_s(4096, 128) == pytest.approx(1431 * TFLOPS)
    assert rates.attention_flops_per_s(1024, 128) < rates.attention_flops_per_s(4096, 128) <= h.peak_flops["bf16"]
    p = ParallelConfig(pp=2, microbatches=4, seq_len=4096)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ScheduleWarning)
        flash = run_schedule("1f1b", m, h, p, runtime=ops_runtime(m, p, h, "flash"))
    unfused = run_schedule("1f1b", m, h, p, runtime=ops_runtime(m, p, h, "unfused"))
    assert flash.report.step_time_s < unfused.report.step_time_s
    _, _, _, ctx = _ctx(hw="b200", seq_len=4096, pp=2, tp=1)
    c = flash.costs.chunks[0]
    names = {o.name for o in chunk_breakdown(ctx, c.layers, c.has_embedding, c.has_head, c.params)}
    assert "attention" in names and "softmax" not in names  # one fused operator, no materialised scores
    mi = load_profile("mi300x")
    with pytest.warns(ScheduleWarning, match="no measured fused-attention rate"):
        ops_runtime(m, p, mi, "flash")
    with warnings.catch_warnings():
        warnings.simplefilter("error", ScheduleWarning)
        ops_runtime(m, p, mi, "unfused")  # asked for explicitly: nothing to warn about
