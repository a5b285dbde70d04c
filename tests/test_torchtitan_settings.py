"""torchtitan's settings as simtrain settings: the selective-op recompute policy (every second
matmul), the fp32 gradient reduction of FSDP2, and the published torchtitan cases' checks (the
memory bound and MFU arithmetic that fix R3's vocabulary, and recompute_ops reaching the model)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import yaml

from simtrain.costs.ops import EVERY_SECOND_MM, _Ctx, chunk_breakdown, ops_runtime, parse_recompute, published_runtime
from simtrain.costs.kernels import rates_for
from simtrain.errors import SimtrainError
from simtrain.hardware import GiB, load_profile
from simtrain.models import load_model
from simtrain.parallel import ParallelConfig
from simtrain.published import load_suite, run_suite, suite_path
from simtrain.scenario import run_schedule

from conftest import SMALL, invoke


def _ctx(model, recompute, tp=2):
    m, h = model, load_profile("h100-sxm")
    p = ParallelConfig(tp=tp, pp=2, microbatches=4, seq_len=2048, recompute="none")
    r = rates_for(h)
    return _Ctx(m, p, r, "flash", h.hbm_bandwidth_bytes_per_s * r.hbm_efficiency, parse_recompute(recompute))


def _rerun(ctx):
    return next(o for o in chunk_breakdown(ctx, (0, 1), False, False, 0.0) if o.name == "recompute")


@pytest.mark.parametrize("activation", ["swiglu", "gelu"])
def test_every_second_mm_reruns_wk_wo_and_the_second_ffn_matmul_and_no_attention(activation):
    m = load_model("llama3-8b").model_copy(update=dict(activation=activation))
    h, f, kv = m.hidden_size, m.ffn_hidden_size, m.kv_heads * m.q_head_dim
    ctx = _ctx(m, EVERY_SECOND_MM)
    tokens, tp = ctx.tokens, ctx.parallel.tp
    # Llama block mms: wq wk wv wo w1 w3 w2 -> wk, wo, w3; GeLU: wq wk wv wo w1 w2 -> wk, wo, w2
    per_token = 2 * (h * kv + h * h + h * f) / tp
    rec = _rerun(ctx)
    assert rec.flops[1] == pytest.approx(2 * tokens * per_token)  # two layers
    base = {o.name: o for o in chunk_breakdown(_ctx(m, "none"), (0, 1), False, False, 0.0)}
    memory_bound = sum(base[n].seconds[0] for n in ("norm", "residual", "activation", "rotary"))
    assert rec.seconds[1] > memory_bound  # the memory-bound operators and three GEMMs per layer
    assert rec.bytes[1] > sum(base[n].bytes[0] for n in ("norm", "residual", "activation", "rotary"))
    selective = _rerun(_ctx(m, "selective"))
    assert selective.flops[1] == pytest.approx(base["attention"].flops[0])  # selective reruns attention instead
    assert "attention" not in parse_recompute(EVERY_SECOND_MM)


def test_every_second_mm_slows_the_backward_and_counts_in_hfu_but_not_mfu():
    model, hw = load_model("llama3-8b"), load_profile("h100-sxm")
    par = ParallelConfig(pp=2, dp=2, microbatches=4, seq_len=2048, recompute="none")
    runs = {rc: run_schedule("1f1b", model, hw, par, runtime=ops_runtime(model, par, hw, recompute=rc))
            for rc in ("none", EVERY_SECOND_MM)}
    assert runs[EVERY_SECOND_MM].costs.chunks[0].backward_input_s > runs["none"].costs.chunks[0].backward_input_s
    assert runs[EVERY_SECOND_MM].report.model_flops == pytest.approx(runs["none"].report.model_flops)


def test_every_second_mm_bad_inputs_are_one_error_line():
    with pytest.raises(SimtrainError, match="MLA"):
        ops_runtime(load_model("deepseek-v3"), ParallelConfig(ep=8, pp=2), load_profile("h100-sxm"),
                    recompute=EVERY_SECOND_MM)
    res = invoke("compare", *SMALL, "--schedules", "1f1b", "--recompute", "every-third-mm")
    assert res.exit_code == 2 and "error: --recompute = 'every-third-mm'" in res.output
    assert "every-second-mm" in res.output  # the allowed names include the policy
    ok = invoke("compare", *SMALL, "--schedules", "1f1b", "--recompute", "every-second-mm", "--json")
    assert ok.exit_code == 0, ok.output


def _dp_tasks(run):
    cols = run.result.columns
    return cols["bytes"][cols["kind"] == "dp"]


def test_fp32_gradient_reduction_doubles_the_reduce_scatter_bytes_and_its_buffers():
    model, hw = load_model("llama3-8b"), load_profile("a100-sxm-80gb")
    base = dict(pp=1, dp=8, microbatches=2, seq_len=2048, zero_stage=3, sequence_parallel=False)
    runs = {d: run_schedule("1f1b", model, hw, ParallelConfig(**base, grad_reduce_dtype=d)) for d in (None, "fp32")}
    bf16, fp32 = (_dp_tasks(runs[d]) for d in (None, "fp32"))
    assert len(bf16) == len(fp32) > 0 and np.allclose(fp32, 2 * bf16)
    assert runs["fp32"].report.step_time_s >= runs[None].report.step_time_s
    assert max(runs["fp32"].report.peak_memory_bytes) > max(runs[None].report.peak_memory_bytes)
    # the default is the gradient's own dtype: an fp32 run already reduces 4 bytes
    f32 = dict(base, dtype="fp32", zero_stage=1, pp=4, microbatches=4)
    same = [_dp_tasks(run_schedule("1f1b", model, load_profile("h100-sxm"), ParallelConfig(**f32, grad_reduce_dtype=d)))
            for d in (None, "fp32")]
    assert np.allclose(same[0], same[1])


def test_a_bad_grad_reduce_dtype_is_one_error_line():
    res = invoke("compare", *SMALL, "--schedules", "1f1b", "--grad-reduce-dtype", "int8")
    assert res.exit_code == 2 and "error: --grad-reduce-dtype = 'int8'" in res.output and "'fp32'" in res.output


def _r3():
    return next(c for c in load_suite().cases if c.name.startswith("R3-"))


def _rank0_params(vocab: int) -> float:
    """Parameters of R3's rank 0 (embedding + 4 of 32 layers), from simtrain's count."""
    m = load_model("llama3-8b").model_copy(update=dict(vocab_size=vocab, published_total_params=None))
    return m.embedding_params() + 4 * (m.total_params - m.embedding_params() - m.head_params()) / 32


def test_r3_vocabulary_128k_is_ruled_out_by_the_measured_peaks_and_the_shipped_one_is_not():
    figures = [f.value for f in _r3().figures]
    fp32_state = 16  # B per parameter: fp32 weight, gradient, AdamW moments, all live at the step
    assert fp32_state * _rank0_params(128256) / GiB > 20.5 > max(v for v in figures if v < 20)  # 17.97, 15.86
    shipped = _r3().model["vocab_size"]
    assert fp32_state * _rank0_params(shipped) / GiB < min(figures)


def test_r3_logged_mfu_over_tps_matches_torchtitan_flops_for_the_test_tokenizer_only():
    """torchtitan (95677cb) train.py: mfu = (6 N + 12 l h q t) tps / peak, N without the embedding."""
    logged = [(4.16e-2, 304), (4.65e-2, 339), (3.33e-2, 243)]
    low = max((mfu - 5e-5) / (tps + 0.5) for mfu, tps in logged)
    high = min((mfu + 5e-5) / (tps - 0.5) for mfu, tps in logged)

    def ratio(vocab, peak):
        m = load_model("llama3-8b").model_copy(update=dict(vocab_size=vocab, published_total_params=None))
        n = m.total_params - m.embedding_params()
        return (6 * n + 12 * m.num_layers * m.hidden_size * 512) / peak

    assert low <= ratio(2256, 312e12) <= high
    assert not any(low <= ratio(128256, peak) <= high for peak in (312e12, 756e12, 835e12, 989e12))


def test_figure_recompute_ops_reach_the_per_operator_model(tmp_path):
    data = yaml.safe_load(suite_path().read_text())
    case = next(c for c in data["cases"] if c["name"] == "torchtitan-llama3-fsdp-a100")
    case["figures"] = [f for f in case["figures"] if f.get("recompute_ops")]
    assert case["figures"], "the 8B figure names its recompute policy"
    with_ops = run_suite(published_runtime, cases=[case["name"]])
    case["figures"][0].pop("recompute_ops")
    bad = tmp_path / "runs.yaml"
    bad.write_text(yaml.safe_dump(data))
    without = run_suite(published_runtime, path=bad, cases=[case["name"]])
    assert with_ops[0].predicted != pytest.approx(without[0].predicted)
    case["figures"][0]["recompute_ops"] = "every-third-mm"
    bad.write_text(yaml.safe_dump(data))
    with pytest.raises(SimtrainError, match="torchtitan-llama3-fsdp-a100 figure 1.*every-third-mm"):
        run_suite(published_runtime, path=bad, cases=[case["name"]])


@pytest.mark.parametrize("zero_stage", [0, 1, 2, 3])
def test_memory_breakdown_shards_weights_and_gradients_as_the_zero_stage_says(zero_stage):
    model, hw = load_model("llama3-8b"), load_profile("a100-sxm-80gb")
    par = ParallelConfig(pp=4, dp=8, microbatches=4, seq_len=2048, zero_stage=zero_stage)
    run = run_schedule("1f1b", model, hw, par)
    part = run.report.memory_breakdown_bytes[0]
    held = run.costs.chunks[0].params
    assert part["weights"] == pytest.approx(held * 2 / (8 if zero_stage >= 3 else 1))
    assert part["gradients"] == pytest.approx(held * 2 / (8 if zero_stage >= 2 else 1))
    assert part["optimizer_states"] == pytest.approx(held * 12 / (8 if zero_stage >= 1 else 1))
    assert all(v >= 0 for v in part.values())


def test_autograd_w_pending_holds_every_activation_and_the_output_gradients_until_w():
    model, hw = load_model("llama3-8b"), load_profile("h100-sxm")
    base = dict(pp=4, vp=2, microbatches=8, seq_len=1024, recompute="none", sequence_parallel=False)
    runs = {w: run_schedule("interleaved-zb", model, hw, ParallelConfig(**base, w_pending=w)) for w in ("gemm-io", "autograd")}
    io, graph = (runs[w].costs.chunks[1] for w in ("gemm-io", "autograd"))
    assert graph.activation_bytes == io.activation_bytes
    assert io.weight_grad_bytes < graph.weight_grad_bytes > graph.activation_bytes  # all of it, plus dY
    tokens, h, f = 1024, model.hidden_size, model.ffn_hidden_size
    out_grads = 2 * tokens * len(io.layers) * (h + model.kv_heads * 256 + h + 2 * f + h)  # qkv, o, up, down outputs
    assert graph.weight_grad_bytes == pytest.approx(graph.activation_bytes + out_grads)
    assert max(runs["autograd"].report.peak_memory_bytes) > max(runs["gemm-io"].report.peak_memory_bytes)
    # an unsplit backward frees everything at B: the setting changes nothing
    one = [run_schedule("1f1b", model, hw, ParallelConfig(**{**base, "vp": 1}, w_pending=w)).report.peak_memory_bytes
           for w in ("gemm-io", "autograd")]
    assert one[0] == one[1]


def test_a_bad_w_pending_names_the_field():
    from simtrain.cli.settings import parallel_from

    with pytest.raises(SimtrainError, match="field 'parallel.w_pending' = 'all'.*'gemm-io' or 'autograd'"):
        parallel_from({"w_pending": "all"}, {}, "job.yaml")


@pytest.mark.parametrize("zero_stage", [0, 1])
def test_foreach_adam_holds_an_fp32_temporary_of_the_largest_chunk_while_it_steps(zero_stage):
    model, hw = load_model("llama3-8b"), load_profile("h100-sxm")
    base = dict(pp=4, vp=2, dp=2, microbatches=8, seq_len=1024, recompute="full", zero_stage=zero_stage)
    runs = {o: run_schedule("interleaved-1f1b", model, hw, ParallelConfig(**base, optimizer_impl=o))
            for o in ("fused", "foreach")}
    held = [c for c in range(8) if runs["foreach"].schedule.stage_to_rank[c] == 0]
    temp = max(runs["foreach"].costs.chunks[c].params for c in held) * 4 / (2 if zero_stage else 1)
    static = runs["fused"].costs.static_bytes(held)
    fused, foreach = (runs[o].report.peak_memory_bytes[0] for o in ("fused", "foreach"))
    assert foreach == pytest.approx(max(fused, static + temp))  # the step comes after the activations are freed
    part = runs["foreach"].report.memory_breakdown_bytes[0]
    assert sum(part.values()) == pytest.approx(foreach)
    assert foreach > fused  # full recompute: the step is the peak; its temporary counts as optimizer state
    assert part["optimizer_states"] == pytest.approx(static - part["weights"] - part["gradients"] + temp)


def test_a_bad_optimizer_impl_names_the_field():
    from simtrain.cli.settings import parallel_from

    with pytest.raises(SimtrainError, match="field 'parallel.optimizer_impl' = 'apex'.*'fused' or 'foreach'"):
        parallel_from({"optimizer_impl": "apex"}, {}, "job.yaml")
