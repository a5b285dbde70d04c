"""Multi-token prediction (DeepSeek-V3 §2.2): parameters, FLOPs, seconds and memory of the MTP modules
on the last stage, each checked against the formula written out here, and bad input."""

from __future__ import annotations

import pytest

from conftest import invoke
from simtrain.costs import stage_costs
from simtrain.costs.ops import chunk_breakdown, ops_runtime
from simtrain.hardware import load_profile
from simtrain.memory import memory_breakdown
from simtrain.models import ModelSpec, load_model
from simtrain.parallel import ParallelConfig
from simtrain.scenario import run_schedule

H800 = load_profile("h800")
DSV3 = load_model("deepseek-v3")
H, V, S = 7168, 129280, 4096  # DeepSeek-V3's hidden size, vocabulary, pre-training sequence (§4.2)


def _block_params() -> int:
    """One DeepSeek-V3 MoE block from §4.2's shapes: MLA (d_c' 1536, d_c 512, 128 heads of 128 + 64
    RoPE, values 128), 1 shared + 256 routed SwiGLU experts of 2048, the router with its bias, norms."""
    mla = (H * 1536 + 1536 + 1536 * 128 * 192 + H * (512 + 64) + 512 + 512 * 128 * (128 + 128) + 128 * 128 * H)
    return mla + 2 * H + 257 * 3 * H * 2048 + 256 * H + 256


def _mtp_flops_per_token() -> tuple[float, float]:
    """(GEMM, attention-score) forward FLOPs per token of one MTP module of DeepSeek-V3: the MoE
    block (MLA projections, router, 8 routed + 1 shared experts; scores 2 s a (d_qk + d_v)), the
    2h -> h projection and the shared head (2 h V)."""
    mla = 2 * (H * 1536 + 1536 * 128 * 192 + H * 576 + 512 * 128 * 256 + 128 * 128 * H)
    block = mla + 2 * H * 256 + 9 * 2 * 3 * H * 2048
    return block + 2 * 2 * H * H + 2 * H * V, 2 * S * 128 * (192 + 128)


def test_deepseek_v3_has_one_mtp_module_counted_apart_from_its_671b():
    assert DSV3.mtp_depth == 1
    assert 670.5e9 < DSV3.total_params < 671.5e9  # the report's 671B leaves MTP out
    assert DSV3.mtp_params == 3 * H + 2 * H * H + _block_params()
    # the HF checkpoint (685B = "671B of the Main Model weights and 14B of the MTP Module weights",
    # both rounded) also stores copies of the shared embedding and output head in its MTP layer
    assert 13.0e9 < DSV3.mtp_params + 2 * V * H < 14.5e9
    assert DSV3.model_copy(update=dict(mtp_depth=2)).mtp_params == 2 * DSV3.mtp_params


@pytest.mark.parametrize("cost_model", ["flat", "ops"])
def test_the_last_stage_costs_the_mtp_modules_flops_and_nothing_else_moves(cost_model):
    par = ParallelConfig(pp=4, dp=64, ep=64, microbatches=8, seq_len=S, zero_stage=1)
    without = DSV3.model_copy(update=dict(mtp_depth=0))
    costs = {}
    for m in (without, DSV3):
        flat = stage_costs(m, par, H800, 4)
        costs[m.mtp_depth] = flat if cost_model == "flat" else ops_runtime(m, par, H800)(flat)
    gemm, attn = _mtp_flops_per_token()
    a, b = costs[0].chunks[-1], costs[1].chunks[-1]
    assert b.layers == a.layers + (61,)  # the MTP block, numbered as in the checkpoint
    assert b.forward_flops - a.forward_flops == pytest.approx(S * (gemm + attn), rel=1e-12)
    assert b.backward_input_flops - a.backward_input_flops == pytest.approx(S * (gemm + 2 * attn), rel=1e-12)
    assert b.backward_weight_flops - a.backward_weight_flops == pytest.approx(S * gemm, rel=1e-12)
    assert b.forward_s > a.forward_s and b.backward_input_s > a.backward_input_s and b.backward_weight_s > a.backward_weight_s
    assert len(b.moe.blocks) == len(a.moe.blocks) + 1  # the MoE block has its own dispatch and combine
    for x, y in zip(costs[0].chunks[:-1], costs[1].chunks[:-1]):
        assert x == y


def test_the_per_operator_breakdown_prices_the_projection_and_the_shared_head():
    par = ParallelConfig(pp=4, dp=64, ep=64, microbatches=8, seq_len=S, zero_stage=1)
    runtime = ops_runtime(DSV3, par, H800, fp8="gemms")
    costs = runtime(stage_costs(DSV3, par, H800, 4))
    c = costs.chunks[-1]
    ops = {o.name: o for o in chunk_breakdown(runtime.ctx, c.layers, c.has_embedding, c.has_head, c.params)}
    assert ops["mtp:proj"].flops == (2 * S * 2 * H * H,) * 3
    assert ops["mtp:lm_head"].flops == ops["head:lm_head"].flops == (2 * S * H * V,) * 3
    assert ops["mtp:lm_head"].seconds == ops["head:lm_head"].seconds  # the head stays in BF16 (§3.3.1)
    assert ops["mtp:proj"].seconds[0] < 2 * S * 2 * H * H / H800.peak_flops["bf16"]  # an FP8 GEMM
    assert ops["mtp:norm"].bytes[0] == 2 * 2 * 2 * H * S  # two RMSNorms, read and write h BF16 values
    assert "mtp:fp8_cast" in ops and "mtp:cross_entropy" in ops and "mtp:embedding" in ops
    assert [sum(o.seconds[p] for o in ops.values()) for p in range(3)] == \
        pytest.approx([c.forward_s, c.backward_input_s, c.backward_weight_s], rel=1e-12)


def test_parameters_and_their_static_memory_sit_on_the_last_stage():
    par = ParallelConfig(pp=4, dp=64, ep=64, microbatches=8, seq_len=S, zero_stage=1)
    a, b = (stage_costs(m, par, H800, 4) for m in (DSV3.model_copy(update=dict(mtp_depth=0)), DSV3))
    own = 3 * H + 2 * H * H + _block_params() - 256 * 3 * H * 2048 + 4 * 3 * H * 2048  # 256 / ep 64 experts per GPU
    assert b.chunks[-1].params - a.chunks[-1].params == own + V * H  # and a copy of the embedding
    assert b.chunks[-1].expert_params - a.chunks[-1].expert_params == 4 * 3 * H * 2048
    assert a.tied_embedding_params == 0 and b.tied_embedding_params == V * H
    # a rank holding the first and the last chunk (DualPipe) keeps one embedding matrix (§3.2.3)
    both = b.static_bytes([0, 3])
    assert both == pytest.approx(b.static_bytes([0]) + b.static_bytes([3]) - V * H * b.static_bytes_per_param)
    assert b.held_params([0, 3]) == b.chunks[0].params + b.chunks[3].params - V * H
    assert b.held_params([0, 3], trainable=True) == b.held_params([0, 3])  # nothing frozen here
    assert b.optimizer_s([0, 3]) < b.optimizer_s([0]) + b.optimizer_s([3])


TINY = ModelSpec(name="tiny-mtp", num_layers=4, hidden_size=256, ffn_hidden_size=512, num_heads=4, vocab_size=4096,
                 seq_len=512, mtp_depth=1)
"""A small dense model with one MTP module, to simulate whole steps quickly."""


@pytest.mark.parametrize("schedule, shared", [("1f1b", False), ("dualpipe", True)])
def test_memory_and_mfu_of_a_simulated_step(schedule, shared):
    hw = load_profile("h100-sxm")
    par = ParallelConfig(pp=2, microbatches=4, seq_len=512)
    runs = {m.mtp_depth: run_schedule(schedule, m, hw, par) for m in (TINY.model_copy(update=dict(mtp_depth=0)), TINY)}
    h, v = TINY.hidden_size, TINY.vocab_size
    own = TINY.mtp_module_params()
    last = runs[1].schedule.stage_to_rank[-1] if schedule == "1f1b" else 0
    weights = [memory_breakdown(r.result, r.costs, r.schedule)[last]["weights"] for r in (runs[0], runs[1])]
    per = runs[1].costs.static_parts_per_param[0]
    assert weights[1] - weights[0] == pytest.approx((own + (0 if shared else v * h)) * per)
    assert runs[1].report.peak_memory_bytes[last] > runs[0].report.peak_memory_bytes[last]
    syncs = runs[1].result.table["name"] == "embedding grad all-reduce"
    assert bool(syncs.any()) == (not shared)  # DualPipe shares the matrix on one rank: nothing to sync
    # MFU counts the module's FLOPs: per microbatch F + I + W = 3 x its forward GEMMs + 3 x scores
    gemm = 2 * (h * 3 * h + h * h + h * 2 * 512 + 512 * h) + 2 * 2 * h * h + 2 * h * v
    scores = 2 * 512 * 4 * (64 + 64)
    extra = par.microbatches * 512 * (3 * gemm + 3 * scores)
    assert runs[1].report.model_flops - runs[0].report.model_flops == pytest.approx(extra, rel=1e-9)


@pytest.mark.parametrize("value, needle", [
    ("-1", "field 'mtp_depth' = -1: Input should be greater than or equal to 0"),
    ("65", "field 'mtp_depth' = 65: Input should be less than or equal to 64"),
])
def test_bad_mtp_depth_is_one_error_line(tmp_path, value, needle):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nnum_layers: 2\nhidden_size: 64\nffn_hidden_size: 64\nnum_heads: 4\nvocab_size: 10\n"
                   f"seq_len: 8\nmtp_depth: {value}\n")
    res = invoke("compare", "--model", str(bad), "--hardware", "h100-sxm", "--op-times", "1,1,1")
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0]
    assert "Traceback" not in res.output
