"""Code paths priced as several kernels (simtrain.costs.unfused): Megatron-Core's unfused rotary
embedding (rope_fusion false), its unfused bias add (bias_dropout_fusion false) and Transformer
Engine's per-expert GEMMs (expert_gemm multi-stream): bytes, kernels, rates and bad input."""

from __future__ import annotations

import dataclasses

import pytest
from pydantic import ValidationError

from simtrain.costs import stage_costs
from simtrain.costs.moe_ops import moe_totals
from simtrain.costs.ops import _gemm, chunk_breakdown, ops_runtime
from simtrain.costs.unfused import (BIAS_ADD, BIAS_ADD_BYTES, FREQ_BYTES_PER_ELEMENT, ROTARY_UNFUSED_BYTES,
                                    ROTARY_UNFUSED_KERNELS)
from simtrain.hardware import load_profile
from simtrain.models import ModelSpec, load_model
from simtrain.parallel import ParallelConfig
from simtrain.published import load_suite

GPT_OSS = dict(name="gpt-oss-like", num_layers=4, hidden_size=2880, ffn_hidden_size=2880, num_heads=64,
               num_kv_heads=8, head_dim=64, vocab_size=201088, seq_len=4096, activation="swiglu",
               norm="rmsnorm", bias=True,
               moe=dict(num_experts=128, top_k=4, expert_ffn_hidden_size=2880, router_bias=True))


def _rows(model, fp8=None, **par):
    p = ParallelConfig(**{"pp": 2, "dp": 8, "ep": 8, "microbatches": 4, "seq_len": 4096, "zero_stage": 1,
                          "sequence_parallel": False, **par})
    hw = load_profile("h100-sxm")
    runtime = ops_runtime(model, p, hw, recompute="none", fp8=fp8)
    flat = stage_costs(model, p, hw, p.pp)
    c = flat.chunks[0]
    ops = chunk_breakdown(runtime.ctx, c.layers, c.has_embedding, c.has_head, c.params)
    return {o.name: o for o in ops}, runtime, flat, len(c.layers)


def test_unfused_rotary_counts_megatrons_eager_ops():
    m = ModelSpec(**GPT_OSS)
    fused, _, _, layers = _rows(m)
    rows, runtime, _, _ = _rows(m, rope_fusion=False)
    e, s = 2, 4096
    elements = s * (m.num_heads + m.kv_heads) * m.q_head_dim  # queries and keys, tp 1
    assert fused["rotary"].bytes[:2] == pytest.approx((layers * 2 * e * elements,) * 2)
    freqs = 2 * FREQ_BYTES_PER_ELEMENT * s * m.q_head_dim  # cos/sin of the fp32 frequencies, two calls
    assert rows["rotary"].bytes[0] == pytest.approx(layers * (ROTARY_UNFUSED_BYTES[0] * e * elements + freqs))
    assert rows["rotary"].bytes[1] == pytest.approx(layers * ROTARY_UNFUSED_BYTES[1] * e * elements)
    assert rows["rotary"].bytes[2] == 0.0 and rows["rotary"].flops == (0.0, 0.0, 0.0)
    assert fused["rotary"].kernels == (2 * layers, 2 * layers, 0)
    assert rows["rotary"].kernels == tuple(2.0 * layers * k for k in ROTARY_UNFUSED_KERNELS) + (0.0,)
    hbm = runtime.ctx.hbm_bytes_per_s
    assert rows["rotary"].seconds == pytest.approx(tuple(b / hbm for b in rows["rotary"].bytes))
    # nothing else moves: the chunk's F and I grow by the rotary difference alone
    for p in range(3):
        extra = rows["rotary"].seconds[p] - fused["rotary"].seconds[p]
        assert sum(o.seconds[p] for n, o in rows.items() if n != "launch") == pytest.approx(
            sum(o.seconds[p] for n, o in fused.items() if n != "launch") + extra, rel=1e-12)


def test_unfused_rotary_with_eager_kernels_is_refused():
    with pytest.raises(ValidationError, match="rope_fusion"):
        ParallelConfig(rope_fusion=False, kernels="eager")


@pytest.mark.parametrize("bias,fusion,moe,count", [(True, False, True, 1), (True, False, False, 2),
                                                   (False, False, True, 0), (True, True, True, 0)])
def test_unfused_bias_add_per_biased_projection(bias, fusion, moe, count):
    spec = {**GPT_OSS, "bias": bias}
    if not moe:
        spec.pop("moe")
    rows, _, _, layers = _rows(ModelSpec(**spec), bias_dropout_fusion=fusion, ep=8 if moe else 1)
    if not count:
        assert BIAS_ADD not in rows
        return
    op = rows[BIAS_ADD]
    assert op.bytes == pytest.approx((layers * count * BIAS_ADD_BYTES * 2 * 4096 * 2880, 0.0, 0.0))
    assert op.kernels == (layers * count, 0.0, 0.0)


def test_bias_add_shards_with_sequence_parallelism():
    m = ModelSpec(**{k: v for k, v in GPT_OSS.items() if k != "moe"})
    plain, *_ = _rows(m, bias_dropout_fusion=False, tp=2, ep=1, dp=4)
    sp, *_ = _rows(m, bias_dropout_fusion=False, tp=2, ep=1, dp=4, sequence_parallel=True)
    assert sp[BIAS_ADD].bytes[0] == pytest.approx(plain[BIAS_ADD].bytes[0] / 2)


@pytest.mark.parametrize("fp8", [None, "gemms"])
def test_multi_stream_experts_run_each_gemm_at_its_own_rate(fp8):
    m = ModelSpec(**GPT_OSS)
    grouped, runtime, _, layers = _rows(m, fp8=fp8)
    multi, *_ = _rows(m, fp8=fp8, expert_gemm="multi-stream")
    groups = m.moe.num_experts // 8
    rows = 4096 * m.moe.top_k / groups  # each local expert's rows (ep 8, uniform routing)
    for name, k, n in (("expert_up", 2880, 2 * 2880), ("expert_down", 2880, 2880)):
        one = _gemm(name, rows, k, n, runtime.ctx, batch=1)
        assert multi[name].seconds == pytest.approx(tuple(layers * groups * s for s in one.seconds), rel=1e-12)
        batched = _gemm(name, rows, k, n, runtime.ctx, batch=groups)
        assert grouped[name].seconds == pytest.approx(tuple(layers * groups * s for s in batched.seconds), rel=1e-12)
        assert multi[name].flops == grouped[name].flops and multi[name].bytes == grouped[name].bytes
        # the table's rate never falls with the batch, so per-expert GEMMs are never faster
        assert all(a > b for a, b in zip(multi[name].seconds, grouped[name].seconds))
        assert multi[name].kernels == (layers * groups,) * 3 and grouped[name].kernels == (layers,) * 3


def test_multi_stream_time_reaches_the_moe_blocks():
    m = ModelSpec(**GPT_OSS)
    grouped, g_run, g_flat, _ = _rows(m)
    multi, m_run, m_flat, _ = _rows(m, expert_gemm="multi-stream")
    extra = [sum(multi[n].seconds[p] - grouped[n].seconds[p] for n in ("expert_up", "expert_down")) for p in range(3)]
    base, chunk = g_run(g_flat).chunks[0], m_run(m_flat).chunks[0]
    assert list(moe_totals(chunk.moe)) == pytest.approx([a + b for a, b in zip(moe_totals(base.moe), extra)],
                                                        rel=1e-9)
    assert sum(b.expert_backward_weight_s for b in chunk.moe.blocks) == pytest.approx(
        sum(b.expert_backward_weight_s for b in base.moe.blocks) + extra[2], rel=1e-9)


def test_defaults_keep_the_fused_paths():
    p = ParallelConfig()
    assert (p.expert_gemm, p.rope_fusion, p.bias_dropout_fusion) == ("grouped", True, True)
    m = load_model("qwen3-30b-a3b").model_copy(update=dict(num_layers=2))
    a, *_ = _rows(m)
    b, *_ = _rows(m, rope_fusion=True, bias_dropout_fusion=False)  # no biases: nothing to add
    assert {n: dataclasses.astuple(o) for n, o in a.items()} == {n: dataclasses.astuple(o) for n, o in b.items()}


def test_bad_expert_gemm_is_refused():
    with pytest.raises(ValidationError, match="expert_gemm"):
        ParallelConfig(expert_gemm="cutlass")


def test_published_megatron_bridge_cases_name_their_code_paths():
    cases = {c.name: c for c in load_suite().cases}
    oss = cases["megatron-bridge-h100-bf16"].settings
    assert (oss["expert_gemm"], oss["rope_fusion"], oss["bias_dropout_fusion"]) == ("multi-stream", False, False)
    assert cases["megatron-bridge-h100-moe-fp8"].settings["expert_gemm"] == "multi-stream"
    assert "expert_gemm" not in cases["deepseek-v3-pretraining"].settings  # DeepGEMM's grouped kernels
