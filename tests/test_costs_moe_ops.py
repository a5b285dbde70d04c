"""The per-operator model of MoE layers (simtrain.costs.moe_ops): FLOPs equal to the flat model's,
segments that add up to the chunk and the breakdown, the all-to-alls untouched, expert GEMMs
priced at their per-expert shape, recomputation by module, and auto taking it for MoE models."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from simtrain.cli import app
from simtrain.cost_models import parse_cost_choice
from simtrain.costs import stage_costs
from simtrain.costs.moe_ops import EXPERT_OPS, moe_totals, routed_tokens
from simtrain.costs.ops import chunk_breakdown, ops_runtime, parse_recompute, published_runtime
from simtrain.errors import SimtrainError
from simtrain.hardware import load_profile
from simtrain.models import load_model
from simtrain.moe import routed_flops_per_token
from simtrain.parallel import ParallelConfig
from simtrain.published import load_suite, run_suite, suite_path

SMALL_DSV3 = dict(num_layers=8)  # DeepSeek-V3's layers (3 dense, then MoE), fewer of them


def _setup(model="deepseek-v3", hw="h800", recompute="none", fp8=None, **par):
    m = load_model(model)
    if model == "deepseek-v3":
        m = m.model_copy(update=SMALL_DSV3)
    h = load_profile(hw)
    p = ParallelConfig(**{"pp": 2, "dp": 8, "ep": 8, "microbatches": 4, "seq_len": 4096, "zero_stage": 1,
                          "recompute": recompute if recompute in ("none", "selective", "full") else "none", **par})
    runtime = ops_runtime(m, p, h, recompute=recompute, fp8=fp8)
    flat = stage_costs(m, p, h, p.pp)
    return m, p, h, runtime, flat


def _ctx(runtime):
    return runtime.ctx


@pytest.mark.parametrize("model,par", [
    ("deepseek-v3", dict(ep=8)), ("deepseek-v3", dict(ep=1, tp=2, dp=4)),
    ("mixtral-8x7b", dict(ep=8)), ("mixtral-8x7b", dict(tp=2, dp=4, ep=4)),
])
def test_operator_flops_equal_the_flat_models_exactly(model, par):
    m, p, h, runtime, flat = _setup(model, "h100-sxm", **par)
    ctx = _ctx(runtime)
    for c in flat.chunks:
        ops = chunk_breakdown(ctx, c.layers, c.has_embedding, c.has_head, c.params)
        f, i, w = (sum(o.flops[k] for o in ops if o.name != "recompute") for k in range(3))
        assert f == pytest.approx(c.forward_flops, rel=1e-12)
        assert i == pytest.approx(c.backward_input_flops, rel=1e-12)
        assert w == pytest.approx(c.backward_weight_flops, rel=1e-12)
        moe_layers = sum(m.is_moe_layer(layer) for layer in c.layers)
        routed = sum(o.flops[0] for o in ops if o.name in ("expert_up", "expert_down"))
        # simtrain.moe.chunk_cost's expert FLOPs: k x 2 x 3hf per token on b s / tp tokens (with EP:
        # the sequence-parallel shard; without: every token, the experts split over TP)
        assert routed == pytest.approx(moe_layers * routed_flops_per_token(m) * p.microbatch_size * p.seq_len / p.tp,
                                       rel=1e-12)


@pytest.mark.parametrize("recompute", ["none", "full", "norm,mla_up", "experts,permute"])
def test_segments_add_up_to_the_chunk_and_its_breakdown(recompute):
    m, p, h, runtime, flat = _setup(recompute=recompute, expert_imbalance=1.5)
    costs = runtime(flat)
    ctx = _ctx(runtime)
    for c, base in zip(costs.chunks, flat.chunks):
        ops = chunk_breakdown(ctx, c.layers, c.has_embedding, c.has_head, c.params)
        cols = [sum(o.seconds[k] for o in ops) for k in range(3)]
        assert [c.forward_s, c.backward_input_s, c.backward_weight_s] == pytest.approx(cols, rel=1e-12)
        if base.moe is None:
            assert c.moe is None
            continue
        assert list(moe_totals(c.moe)) == pytest.approx(cols, rel=1e-12)
        assert c.moe.full_recompute == (recompute == "full")
        # the communication is the flat model's, block by block
        assert [(b.layer, b.dispatch, b.combine) for b in c.moe.blocks] == \
               [(b.layer, b.dispatch, b.combine) for b in base.moe.blocks]
        rec = next(o for o in ops if o.name == "recompute").seconds[1]
        if recompute == "none":
            assert rec == 0
        elif recompute == "full":
            assert sum(s.recompute_s for s in c.moe.segments) + sum(b.expert_forward_s for b in c.moe.blocks) \
                == pytest.approx(rec, rel=1e-12)
        else:
            names = parse_recompute(recompute)
            assert rec == pytest.approx(sum(o.seconds[0] for o in ops if o.name in names), rel=1e-12) and rec > 0
            experts = sum(o.seconds[1] for o in ops if o.name in EXPERT_OPS)
            rerun_e = sum(o.seconds[0] for o in ops if o.name in EXPERT_OPS and o.name in names)
            assert sum(b.expert_backward_input_s for b in c.moe.blocks) == pytest.approx(experts + rerun_e, rel=1e-12)


def test_norm_and_mla_up_recompute_exactly_the_norms_and_up_projections():
    *_, runtime, flat = _setup(recompute="norm,mla_up")
    ctx = _ctx(runtime)
    c = flat.chunks[1]
    ops = {o.name: o for o in chunk_breakdown(ctx, c.layers, c.has_embedding, c.has_head, c.params)}
    rerun = ops["norm"].seconds[0] + ops["q_up"].seconds[0] + ops["kv_up"].seconds[0]
    assert ops["recompute"].seconds[1] == pytest.approx(rerun, rel=1e-12)
    full = _setup(recompute="full")[3].ctx
    full_rec = next(o for o in chunk_breakdown(full, c.layers, False, c.has_head, c.params) if o.name == "recompute")
    assert 0 < ops["recompute"].seconds[1] < 0.2 * full_rec.seconds[1]


def test_small_expert_gemms_run_slower_per_flop_than_large_ones():
    """ep 1 spreads a GPU's 8 x 4096 token-expert pairs over all 256 experts (128 rows each, below
    the table's smallest tile); ep 8 gives each of its 32 experts 1024 rows."""
    rates = {}
    for ep in (1, 8):
        m, p, h, runtime, flat = _setup(ep=ep)
        ctx = _ctx(runtime)
        c = flat.chunks[1]
        op = next(o for o in chunk_breakdown(ctx, c.layers, False, True, c.params) if o.name == "expert_up")
        rates[ep] = op.flops[0] / op.seconds[0]
        groups = m.moe.num_experts // ep
        rows = routed_tokens(ctx) * m.moe.top_k / groups
        layers = sum(m.is_moe_layer(layer) for layer in c.layers)
        expected = ctx.rates.gemm_flops_per_s(rows, 2 * m.moe.expert_ffn_hidden_size, m.hidden_size, "bf16", groups)
        assert op.seconds[0] == pytest.approx(layers * op.flops[0] / layers / expected, rel=1e-9)
    assert rates[1] < 0.8 * rates[8]


def test_imbalance_slows_the_most_loaded_ranks_experts_not_their_flops():
    ops = {}
    for imb in (1.0, 2.0):
        m, p, h, runtime, flat = _setup(expert_imbalance=imb)
        c = flat.chunks[1]
        ops[imb] = {o.name: o for o in chunk_breakdown(_ctx(runtime), c.layers, False, True, c.params)}
    up1, up2 = ops[1.0]["expert_up"], ops[2.0]["expert_up"]
    assert up1.flops == up2.flops
    assert 1.0 < up2.seconds[0] / up1.seconds[0] <= 2.0  # twice the rows, at a rate at least as high
    assert ops[2.0]["router"].seconds == ops[1.0]["router"].seconds


def test_fp8_gemms_speed_up_the_experts_and_leave_the_router_in_bf16():
    ops = {}
    for fp8 in (None, "gemms"):
        m, p, h, runtime, flat = _setup(fp8=fp8)
        c = flat.chunks[1]
        ops[fp8] = {o.name: o for o in chunk_breakdown(_ctx(runtime), c.layers, False, True, c.params)}
    for name in ("expert_up", "expert_down", "ffn_up", "q_up"):
        assert ops["gemms"][name].seconds[0] < ops[None][name].seconds[0]
    for name in ("router", "attention", "permute", "router_topk"):
        assert ops["gemms"][name].seconds == ops[None][name].seconds


def test_auto_prices_moe_models_by_operator_where_the_profile_has_kernel_tables():
    assert parse_cost_choice("auto", None, None, "flash", load_profile("h800")).model == "ops"
    assert parse_cost_choice("auto", None, None, "unfused", load_profile("v100-sxm2")).model == "flat"
    m, p, h, runtime, flat = _setup()
    priced = runtime(flat)
    assert priced.chunks[1].forward_s != pytest.approx(flat.chunks[1].forward_s, rel=1e-3)
    assert priced.chunks[1].moe.segments != flat.chunks[1].moe.segments


def _compare(*args, model="deepseek-v3"):
    return CliRunner().invoke(app, ["compare", "--model", model, "--hardware", "h800", "--pp", "16", "--dp", "64",
                                    "--ep", "64", "--zero-stage", "1", "--microbatches", "16", "--schedules", "1f1b",
                                    "--seq-len", "1024", "--json", *args])


def test_compare_runs_deepseek_v3_with_its_recompute_modules_and_fp8_gemms():
    rows = {}
    for key, args in {"full": ["--recompute", "full"], "modules": ["--recompute", "norm,mla_up"],
                      "fp8": ["--recompute", "norm,mla_up", "--fp8", "gemms"]}.items():
        res = _compare(*args)
        assert res.exit_code == 0, res.output
        rows[key] = json.loads(res.stdout)[0]
    assert rows["modules"]["step_time_s"] < rows["full"]["step_time_s"]
    assert rows["fp8"]["step_time_s"] < rows["modules"]["step_time_s"]
    # same model FLOPs; HFU counts the reruns: a few for norm,mla_up, a whole forward for full
    assert rows["modules"]["mfu"] == pytest.approx(
        rows["full"]["mfu"] * rows["full"]["step_time_s"] / rows["modules"]["step_time_s"])
    assert rows["modules"]["mfu"] < rows["modules"]["hfu"] < 1.1 * rows["modules"]["mfu"]
    assert rows["full"]["hfu"] > 1.25 * rows["full"]["mfu"]


@pytest.mark.parametrize("model,args,needle", [
    ("mixtral-8x7b", ["--pp", "4", "--ep", "8", "--recompute", "every-second-mm"],
     "--recompute = 'every-second-mm': defined for dense blocks"),
    ("deepseek-v3", ["--recompute", "norm,experts,routers"],
     "--recompute = 'norm,experts,routers': unknown module 'routers'"),
    ("mixtral-8x7b", ["--pp", "4", "--ep", "8", "--recompute", "norm,mla_up"],
     "--recompute = 'norm,mla_up': mixtral-8x7b has no 'mla_up' operator; its layers have qkv, attn_out, router"),
    ("llama3-8b", ["--pp", "4", "--ep", "1", "--recompute", "experts"], "llama3-8b has no 'experts' operator"),
])
def test_bad_moe_recompute_is_one_error_line(model, args, needle):
    res = _compare(*args, model=model)
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], res.stderr


def test_module_groups_need_one_operator_the_model_has():
    m, p, h = _setup()[:3]
    ops_runtime(m, p, h, recompute="attn_core,experts,norm")  # flash: attention stands for the group
    with pytest.raises(SimtrainError, match="has no 'qkv' operator"):
        ops_runtime(m, p, h, recompute="qkv")


def test_every_second_mm_on_an_moe_model_is_refused_by_the_api_too():
    m, p, h = _setup("mixtral-8x7b", "h100-sxm")[:3]
    with pytest.raises(SimtrainError, match="defined for dense blocks"):
        ops_runtime(m, p, h, recompute="every-second-mm")


def _dsv3_case(tmp_path, **change):
    data = yaml.safe_load(suite_path().read_text())
    case = next(c for c in data["cases"] if c["name"] == "deepseek-v3-pretraining")
    case.update(change)
    path = tmp_path / "runs.yaml"
    path.write_text(yaml.safe_dump(data))
    return path, case


def test_the_deepseek_v3_case_runs_its_published_layout_with_fp8_gemms(tmp_path):
    path, case = _dsv3_case(tmp_path, fp8=None)
    par = case["settings"]
    assert par["pp"] * par["dp"] == 2048 and par["dp"] * par["microbatches"] == case["global_batch"] == 15360
    fp8 = run_suite(published_runtime, cases=[case["name"]])[0]
    bf16 = run_suite(published_runtime, path=path, cases=[case["name"]])[0]
    assert fp8.published == bf16.published == pytest.approx(1e12 / (180e3 * 3600), rel=1e-4)
    assert fp8.predicted > bf16.predicted  # FP8 GEMMs are faster; nothing else differs


def test_a_bad_fp8_value_in_the_suite_is_one_error_naming_the_field(tmp_path):
    path, _ = _dsv3_case(tmp_path, fp8="all")
    with pytest.raises(SimtrainError, match="fp8"):
        load_suite(path)


def test_fp8_gemms_leave_the_lm_head_in_the_compute_dtype():
    rows = {}
    for fp8 in (None, "gemms"):
        m, p, h, runtime, flat = _setup(fp8=fp8)
        c = flat.chunks[-1]
        rows[fp8] = {o.name: o for o in chunk_breakdown(runtime.ctx, c.layers, False, True, c.params)}
    assert rows["gemms"]["head:lm_head"].seconds == rows[None]["head:lm_head"].seconds
