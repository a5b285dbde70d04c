"""Megatron-Core's eager work around the routed experts (simtrain.costs.expert_epilogue): the clamps
of a clamped gated activation and the per-expert second-GEMM bias loop, their bytes and kernels,
their rerun with the activation, their place in the MoE segments, and bad input."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from simtrain.costs import stage_costs
from simtrain.costs.expert_epilogue import (BIAS_BYTES_PER_ELEMENT, CLAMP_BYTES_PER_ELEMENT, EXPERT_BIAS,
                                            EXPERT_CLAMP)
from simtrain.costs.moe_ops import moe_totals
from simtrain.costs.ops import chunk_breakdown, ops_runtime
from simtrain.hardware import load_profile
from simtrain.models import ModelSpec, load_model
from simtrain.parallel import ParallelConfig

# GPT-OSS 120B's shape (simtrain/published/runs.yaml), fewer layers
GPT_OSS = dict(name="gpt-oss-like", num_layers=4, hidden_size=2880, ffn_hidden_size=2880, num_heads=64,
               num_kv_heads=8, head_dim=64, vocab_size=201088, seq_len=4096, activation="swiglu",
               norm="rmsnorm", bias=True,
               moe=dict(num_experts=128, top_k=4, expert_ffn_hidden_size=2880, router_bias=True,
                        activation_clamp=7.0))


def _model(bias=True, clamp=7.0):
    spec = {**GPT_OSS, "bias": bias, "moe": {**GPT_OSS["moe"], "activation_clamp": clamp}}
    return ModelSpec(**spec)


def _rows(model, recompute="none", **par):
    p = ParallelConfig(**{"pp": 2, "dp": 8, "ep": 8, "microbatches": 4, "seq_len": 4096, "zero_stage": 1, **par})
    runtime = ops_runtime(model, p, load_profile("h100-sxm"), recompute=recompute)
    flat = stage_costs(model, p, load_profile("h100-sxm"), p.pp)
    c = flat.chunks[0]
    ops = chunk_breakdown(runtime.ctx, c.layers, c.has_embedding, c.has_head, c.params)
    return {o.name: o for o in ops}, runtime, flat, p


def test_bytes_and_kernels_follow_megatrons_eager_ops():
    m = _model()
    rows, runtime, flat, p = _rows(m)
    layers = len(flat.chunks[0].layers)
    pairs = p.microbatch_size * p.seq_len * m.moe.top_k  # ep 8, tp 1: every routed row lands on some GPU
    f, h, e, groups = m.moe.expert_ffn_hidden_size, m.hidden_size, 2, m.moe.num_experts // p.ep
    clamp, bias = rows[EXPERT_CLAMP], rows[EXPERT_BIAS]
    assert clamp.bytes[:2] == pytest.approx(tuple(layers * x * e * pairs * f for x in CLAMP_BYTES_PER_ELEMENT))
    assert bias.bytes[:2] == pytest.approx(tuple(layers * x * e * pairs * h for x in BIAS_BYTES_PER_ELEMENT))
    assert clamp.bytes[2] == bias.bytes[2] == 0.0 and clamp.flops == bias.flops == (0.0, 0.0, 0.0)
    assert clamp.kernels == (3 * layers, 3 * layers, 0)
    assert bias.kernels == ((2 * groups + 1) * layers, 4 * groups * layers, 0)
    hbm = runtime.ctx.hbm_bytes_per_s
    assert clamp.seconds == pytest.approx(tuple(b / hbm for b in clamp.bytes))
    # the clamp's bytes per element against the fused GLU kernel's own (3e forward, 5e backward)
    act = rows["expert_activation"]
    assert clamp.bytes[0] / act.bytes[0] == pytest.approx(8 / 3)
    assert clamp.bytes[1] / act.bytes[1] == pytest.approx(10 / 5)


@pytest.mark.parametrize("bias,clamp,present", [(False, None, set()), (True, None, {EXPERT_BIAS}),
                                                (False, 7.0, {EXPERT_CLAMP}), (True, 7.0, {EXPERT_BIAS, EXPERT_CLAMP})])
def test_each_term_only_where_the_model_has_it(bias, clamp, present):
    rows, *_ = _rows(_model(bias, clamp))
    assert {EXPERT_BIAS, EXPERT_CLAMP} & set(rows) == present


def test_the_terms_add_their_seconds_to_the_moe_blocks():
    plain, with_terms = _rows(_model(False, None)), _rows(_model(True, 7.0))
    extra = [sum(with_terms[0][n].seconds[k] for n in (EXPERT_BIAS, EXPERT_CLAMP)) for k in range(3)]
    assert extra[0] > 0 and extra[1] > 0 and extra[2] == 0
    # W differs only by the biases' own gradient accumulation (more parameters)
    extra[2] = with_terms[0]["grad_accum"].seconds[2] - plain[0]["grad_accum"].seconds[2]
    base, chunk = (r[1](r[2]).chunks[0] for r in (plain, with_terms))
    # the segments (what the lowering runs) carry them, inside the MoE blocks' expert compute
    assert list(moe_totals(chunk.moe)) == pytest.approx([a + b for a, b in zip(moe_totals(base.moe), extra)],
                                                        rel=1e-9)
    assert sum(b.expert_forward_s for b in chunk.moe.blocks) == pytest.approx(
        sum(b.expert_forward_s for b in base.moe.blocks) + extra[0], rel=1e-9)


@pytest.mark.parametrize("recompute,named,reruns_clamp", [
    ("expert_activation", ("expert_activation",), True),
    ("experts", ("expert_up", "expert_activation", "expert_down"), True),
    ("norm", ("norm",), False),
])
def test_recomputing_the_activation_reruns_its_clamps(recompute, named, reruns_clamp):
    rows, *_ = _rows(_model(), recompute=recompute)
    clamp_f = rows[EXPERT_CLAMP].bytes[0]
    expected = sum(rows[n].bytes[0] for n in named) + (clamp_f if reruns_clamp else 0.0)
    assert rows["recompute"].bytes[1] == pytest.approx(expected, rel=1e-12)
    assert rows["recompute"].kernels[1] == sum(rows[n].kernels[0] for n in named) + (
        rows[EXPERT_CLAMP].kernels[0] if reruns_clamp else 0)


def test_bias_term_never_rerun_by_the_activation():
    rows, *_ = _rows(_model(), recompute="expert_activation")
    assert rows["recompute"].bytes[1] == pytest.approx(rows["expert_activation"].bytes[0]
                                                       + rows[EXPERT_CLAMP].bytes[0], rel=1e-12)


@pytest.mark.parametrize("clamp", [0.0, -1.0])
def test_non_positive_clamp_is_refused(clamp):
    with pytest.raises(ValidationError, match="activation_clamp"):
        _model(clamp=clamp)


def test_clamp_needs_a_gated_activation():
    with pytest.raises(ValidationError, match="gated activation"):
        ModelSpec(**{**GPT_OSS, "activation": "gelu"})


def test_presets_without_the_features_have_no_terms():
    for name in ("qwen3-30b-a3b", "mixtral-8x7b"):
        m = load_model(name).model_copy(update=dict(num_layers=2))
        rows, *_ = _rows(m)
        assert EXPERT_CLAMP not in rows and EXPERT_BIAS not in rows
