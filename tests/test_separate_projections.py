"""torchtitan's separate projections (``fused_projections: false``: wq, wk, wv and w1, w3 as their own
GEMMs, their input gradients summed in I) and the TP all-gathers that its selective op policy
(``every-second-mm``) reruns in the backward."""

from __future__ import annotations

import pytest

from simtrain.costs.ops import _gemm, chunk_breakdown, ops_runtime
from simtrain.hardware import load_profile
from simtrain.models import load_model
from simtrain.parallel import ParallelConfig
from simtrain.scenario import run_schedule

TOKENS = 12 * 8192  # the asyncTP bench's 8B rows: local batch 12, sequence 8192


def _setup(**over):
    m, h = load_model("llama3-8b"), load_profile("h100-sxm-96gb")
    p = ParallelConfig(**{**dict(tp=8, pp=1, dp=1, microbatches=1, microbatch_size=12, seq_len=8192, dtype="bf16",
                                 sequence_parallel=True, recompute="selective"), **over})
    return m, h, p


def _rows(m, h, p, recompute=None):
    rt = ops_runtime(m, p, h, recompute=recompute)
    c = run_schedule("1f1b", m, h, p, runtime=rt).costs.chunks[0]
    return {o.name: o for o in chunk_breakdown(rt.ctx, c.layers, c.has_embedding, c.has_head, c.params)}, rt.ctx, c


def test_separate_projections_price_each_gemm_at_its_own_shape():
    m, h, p = _setup(fused_projections=False)
    rows, ctx, _ = _rows(m, h, p)
    fused = _rows(m, h, p.model_copy(update=dict(fused_projections=True)))[0]
    hd, tp, layers = m.q_head_dim, p.tp, m.num_layers
    q, k, v = (_gemm("qkv", TOKENS, m.hidden_size, n / tp, ctx) for n in (32 * hd, 8 * hd, 8 * hd))
    for i in range(3):
        assert rows["qkv"].seconds[i] == pytest.approx(layers * (q.seconds[i] + k.seconds[i] + v.seconds[i]))
        assert rows["qkv"].flops[i] == pytest.approx(fused["qkv"].flops[i])  # the same work
        assert rows["ffn_up"].flops[i] == pytest.approx(fused["ffn_up"].flops[i])
    # at TP 8, wk and wv are N = 128 GEMMs over K = 4096: far slower per FLOP than the 768-wide fused one
    assert rows["qkv"].seconds[0] > 1.5 * fused["qkv"].seconds[0]
    assert rows["qkv"].kernels == (3 * layers, 3 * layers, 3 * layers)  # one GEMM per layer and pass each
    assert rows["ffn_up"].kernels == (2 * layers, 2 * layers, 2 * layers)
    assert "grad_sum" not in fused


@pytest.mark.parametrize("kernels, tensors, launched", [("fused", 4 + 3, 2), ("eager", 3 * 2 + 3 * 1, 3)])
def test_the_input_gradients_of_separate_projections_are_summed_in_i(kernels, tensors, launched):
    """Compiled: one kernel reads the n gradients and writes their sum (q, k, v: 4 tensors; w1, w3: 3);
    eager: autograd adds each further gradient into its buffer (read 2, write 1: 2 adds, then 1)."""
    m, h, p = _setup(fused_projections=False, kernels=kernels)
    rows, ctx, _ = _rows(m, h, p)
    row = rows["grad_sum"]
    tensor = 2 * TOKENS * m.hidden_size  # one bf16 [tokens, h] input gradient: the replicated (gathered) input
    assert row.bytes == pytest.approx((0.0, m.num_layers * tensors * tensor, 0.0))
    assert row.seconds[1] == pytest.approx(row.bytes[1] / ctx.hbm_bytes_per_s)
    assert row.kernels == (0, m.num_layers * launched, 0)


def test_a_model_with_gelu_and_no_gqa_split_differs_only_in_qkv():
    m, h = load_model("gpt3-175b"), load_profile("h100-sxm-96gb")
    p = ParallelConfig(tp=8, pp=8, microbatches=8, seq_len=2048, fused_projections=False)
    rows, _, c = _rows(m, h, p)
    fused = _rows(m, h, p.model_copy(update=dict(fused_projections=True)))[0]
    assert rows["ffn_up"] == fused["ffn_up"]  # one up projection: nothing to split
    assert rows["grad_sum"].kernels[1] == len(c.layers)  # q, k, v's sum only


def test_an_moe_layer_splits_only_its_attention_projections():
    """The FFN of an MoE layer is the experts' (simtrain.costs.moe_ops): no gate/up sum is added."""
    m, h = load_model("mixtral-8x7b"), load_profile("h100-sxm-96gb")
    p = ParallelConfig(tp=8, pp=4, ep=8, dp=8, microbatches=4, seq_len=4096, fused_projections=False,
                       sequence_parallel=True)
    rows, _, c = _rows(m, h, p)
    assert rows["grad_sum"].kernels[1] == len(c.layers)  # q, k, v's sum in every layer, nothing else
    fused = _rows(m, h, p.model_copy(update=dict(fused_projections=True)))[0]
    assert rows["expert_up"] == fused["expert_up"] and "ffn_up" not in rows  # no shared experts in Mixtral


@pytest.mark.parametrize("sp, op, per_layer", [(True, "all-gather", 2), (False, "all-reduce", 1)])
def test_every_second_mm_reruns_the_unsaved_tp_collectives_in_the_backward(sp, op, per_layer):
    """torchtitan's op policy saves the reduce-scatters, not the all-gathers: with SP the backward
    reruns both all-gathers of a block; without SP the all-reduce after wo (mm 4, rerun)."""
    m, h, p = _setup(sequence_parallel=sp)
    _, _, c = _rows(m, h, p, recompute="every-second-mm")
    _, _, plain = _rows(m, h, p)
    f = c.tp_forward[0]
    assert plain.tp_backward == c.tp_forward  # without the policy: the forward's collectives, transposed
    assert c.tp_backward[0] == plain.tp_backward[0]
    extra = c.tp_backward[1]
    assert (extra.op, extra.dim, extra.nbytes, extra.repeat) == (op, "tp", f.nbytes, per_layer * m.num_layers)


def test_the_reruns_lengthen_a_vanilla_tp_step_by_their_collective_time():
    m, h, p = _setup()
    runs = [run_schedule("1f1b", m, h, p, runtime=ops_runtime(m, p, h, recompute=r)) for r in ("every-second-mm",)]
    table = runs[0].result.table
    tp_b = [e - b for n, b, e in zip(table["name"], table["start_s"], table["end_s"]) if n == "tp 0B0"]
    tp_f = [e - b for n, b, e in zip(table["name"], table["start_s"], table["end_s"]) if n == "tp 0F0"]
    # F: 2 all-gathers + 2 reduce-scatters a layer; B: those 4 and the 2 rerun all-gathers (equal sizes)
    assert tp_b[0] == pytest.approx(1.5 * tp_f[0], rel=1e-6)


def test_fused_projections_must_be_a_boolean():
    with pytest.raises(ValueError, match="fused_projections"):
        ParallelConfig(fused_projections="sometimes")
