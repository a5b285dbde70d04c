"""The ``fp8_cast`` operator of ``--fp8 gemms`` (:mod:`simtrain.costs.fp8`): bytes and kernels
counted by hand, absent without FP8, MoE layers, and the ``--breakdown`` row."""

from __future__ import annotations

import json

import pytest

from conftest import SMALL, invoke, tiny_moe
from simtrain.costs.fp8 import cast_bytes_per_element
from simtrain.costs.kernels import rates_for
from simtrain.costs.moe_ops import moe_totals
from simtrain.costs.ops import _Ctx, chunk_breakdown, ops_runtime, parse_recompute
from simtrain.hardware import load_profile
from simtrain.models import load_model
from simtrain.parallel import ParallelConfig
from simtrain.scenario import run_schedule

H100 = load_profile("h100-sxm")


def _ops(model, parallel, fp8: bool, layers=(0,)):
    r = rates_for(H100)
    ctx = _Ctx(model, parallel, r, "flash", H100.hbm_bandwidth_bytes_per_s * r.hbm_efficiency,
               parse_recompute(parallel.recompute), "fp8" if fp8 else None)
    return {o.name: o for o in chunk_breakdown(ctx, layers, False, False, 0.0)}, ctx


def test_cast_bytes_per_bf16_element():
    # amax read 2, cast-transpose read 2, FP8 copy 1, FP8 transpose 1
    assert cast_bytes_per_element(2) == 6 and cast_bytes_per_element(4) == 10


def test_llama3_8b_layer_cast_bytes_counted_by_hand():
    m = load_model("llama3-8b")  # h 4096, 32 heads of 128, 8 KV heads, SwiGLU FFN 14336
    p = ParallelConfig(tp=2, pp=2, microbatches=4, seq_len=2048, recompute="none")
    ops, ctx = _ops(m, p, fp8=True)
    t = 2048
    # per TP rank, split as simtrain.costs.ops._layer_ops splits them (a fan-in of h: by columns):
    # qkv [t,4096]x[4096,3072], attn_out [t,4096]x[4096,2048], ffn_up [t,4096]x[4096,14336],
    # ffn_down [t,7168]x[7168,4096]
    x = t * (4096 + 4096 + 4096 + 7168)
    w = 4096 * 3072 + 4096 * 2048 + 4096 * 14336 + 7168 * 4096
    dy = t * (3072 + 2048 + 14336 + 4096)
    cast = ops["fp8_cast"]
    assert cast.bytes == (6 * (x + w / 4), 6 * dy, 0.0)  # the weights' copy once per 4 microbatches
    assert cast.flops == (0.0, 0.0, 0.0) and cast.bound == "memory"
    assert cast.seconds == pytest.approx(tuple(b / ctx.hbm_bytes_per_s for b in cast.bytes))
    assert cast.kernels == (4 * 3 + 4 * 3 / 4, 4 * 3, 0.0)  # amax, scale, cast per tensor
    two, _ = _ops(m, p, fp8=True, layers=(0, 1))
    assert two["fp8_cast"].bytes[0] == pytest.approx(2 * cast.bytes[0])
    assert two["fp8_cast"].kernels == tuple(2 * k for k in cast.kernels)


def test_no_cast_without_fp8():
    m = load_model("llama3-8b")
    p = ParallelConfig(tp=2, pp=2, microbatches=4, seq_len=2048)
    assert "fp8_cast" not in _ops(m, p, fp8=False)[0]
    moe = tiny_moe()
    pm = ParallelConfig(pp=2, dp=8, ep=8, microbatches=4)
    assert "fp8_cast" not in _ops(moe, pm, fp8=False, layers=(1, 2))[0]


def test_moe_layers_cast_attention_shared_and_routed_experts():
    moe = tiny_moe()  # h 256, 16 experts of 128 (top-4), 1 shared expert, layer 0 dense
    pm = ParallelConfig(pp=2, dp=8, ep=8, microbatches=4, recompute="none")
    ops, _ = _ops(moe, pm, fp8=True, layers=(1,))
    t, h, f = 128, 256, 128
    # attention projections of tiny_moe (MHA, 4 heads x 64 = h): qkv [t,h]x[h,3h], attn_out [t,h]x[h,h]
    q = moe.num_heads * moe.q_head_dim
    kv = moe.kv_heads * moe.q_head_dim
    x_att, w_att, dy_att = t * (h + q), h * (q + 2 * kv) + q * h, t * (q + 2 * kv + h)
    # shared expert (SwiGLU, width 128): up [t,h]x[h,256], down [t,128]x[128,h]
    x_sh, w_sh, dy_sh = t * (h + f), h * 2 * f + f * h, t * (2 * f + h)
    # routed: 4 t pairs over 2 local experts: up [4t,h]x[h,256] (2 weights), down [4t,128]x[128,h]
    r = 4 * t
    x_ex, w_ex, dy_ex = r * (h + f), 2 * (h * 2 * f + f * h), r * (2 * f + h)
    x, w, dy = x_att + x_sh + x_ex, w_att + w_sh + w_ex, dy_att + dy_sh + dy_ex
    assert ops["fp8_cast"].bytes[0] == pytest.approx(6 * (x + w / 4))
    assert ops["fp8_cast"].bytes[1] == pytest.approx(6 * dy)
    # the segments the lowering runs still add up to the breakdown
    run = run_schedule("1f1b", moe, H100, pm, runtime=ops_runtime(moe, pm, H100, fp8="gemms"))
    c = next(c for c in run.costs.chunks if c.moe is not None)
    f_s, i_s, w_s = moe_totals(c.moe)
    assert (f_s, i_s, w_s) == pytest.approx((c.forward_s, c.backward_input_s, c.backward_weight_s))


def test_breakdown_shows_the_fp8_cast_row_only_with_fp8():
    base = ["compare", *SMALL, "--schedules", "1f1b", "--cost-model", "ops", "--breakdown", "1", "--json"]
    rows = {}
    for fp8 in (True, False):
        res = invoke(*base, *(["--fp8", "gemms"] if fp8 else []))
        assert res.exit_code == 0, res.output
        rows[fp8] = {o["name"]: o for o in json.loads(res.stdout)["breakdown"]["operators"]}
    assert "fp8_cast" not in rows[False]
    cast = rows[True]["fp8_cast"]
    assert cast["seconds"][0] > 0 and cast["seconds"][1] > 0 and cast["seconds"][2] == 0
