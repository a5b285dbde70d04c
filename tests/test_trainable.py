"""Frozen weights and LoRA (--trainable): no W, no gradient, no optimizer state for frozen
parameters; LoRA adapters add r (K + N) parameters and 2 r (K + N) FLOPs per token per pass for
every linear layer (Hu et al. 2021 §4.1)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from simtrain.cli import app
from simtrain.costs import OPTIMIZER_BYTES_PER_PARAM, stage_costs
from simtrain.hardware import load_profile
from simtrain.models import load_model
from simtrain.parallel import ParallelConfig
from simtrain.scenario import run_schedule

H100 = load_profile("h100-sxm")
MODEL = load_model("llama3-8b")  # h 4096, 32 heads, 8 KV heads of 128, SwiGLU FFN 14336, 32 layers
S = 4096
LINEARS = [(4096, 4096 + 2 * 8 * 128), (4096, 4096), (4096, 2 * 14336), (14336, 4096)]  # (K, N)


def _costs(trainable: str, **kw):
    par = ParallelConfig(pp=4, seq_len=S, trainable=trainable, **kw)
    return stage_costs(MODEL, par, H100, 4)


def test_frozen_layers_have_no_weight_pass_gradient_or_optimizer_state():
    full, frozen = _costs("all"), _costs("frozen-layers:8-15")  # chunk 1 holds layers 8-15
    c, f = full.chunks[1], frozen.chunks[1]
    assert f.layers == tuple(range(8, 16))
    assert f.backward_weight_flops == 0 and f.weight_grad_bytes == 0
    assert f.backward_weight_s == 0.0  # no W GEMMs (and no gradient accumulation)
    assert f.frozen_params == f.params == c.params
    assert f.forward_s == c.forward_s and f.backward_input_s == c.backward_input_s  # I still runs
    assert frozen.static_bytes([1]) == pytest.approx(2 * c.params)  # the 16-bit weight alone
    assert frozen.optimizer_s([1]) == 0.0
    assert frozen.chunks[0] == full.chunks[0]  # other chunks unchanged


def test_lora_adapters_follow_the_papers_counts():
    r, tokens = 16, S
    base, lora = _costs("all"), _costs(f"lora:{r}")
    c, l = base.chunks[1], lora.chunks[1]
    per_layer = sum(r * (k + n) for k, n in LINEARS)
    assert l.params - l.frozen_params == pytest.approx(8 * per_layer)
    assert l.frozen_params == pytest.approx(c.params)
    assert l.backward_weight_flops == pytest.approx(8 * tokens * 2 * per_layer)  # adapters only
    assert l.forward_flops == pytest.approx(c.forward_flops + 8 * tokens * 2 * per_layer)
    trainable = l.params - l.frozen_params
    assert lora.static_bytes([1]) == pytest.approx(2 * l.frozen_params + 16 * trainable)
    rate = H100.optimizer_bytes_per_s or H100.hbm_bandwidth_bytes_per_s
    assert lora.optimizer_s([1]) == pytest.approx(OPTIMIZER_BYTES_PER_PARAM * trainable / rate)
    assert l.backward_weight_s < c.backward_weight_s / 50
    # embedding and head are frozen too
    assert lora.chunks[0].frozen_params == pytest.approx(base.chunks[0].params)
    assert lora.chunks[-1].frozen_params == pytest.approx(base.chunks[-1].params)


def test_lora_reduces_only_adapter_gradients_over_dp():
    par = ParallelConfig(pp=2, dp=4, microbatches=2, seq_len=S, trainable="lora:8")
    run = run_schedule("1f1b", MODEL, H100, par)
    t = run.result.trace
    reduced = t[t["kind"] == "dp"]["bytes"].sum()
    adapters = sum(c.params - c.frozen_params for c in run.costs.chunks)
    assert reduced == pytest.approx(2 * adapters)  # bf16 gradients of the adapters, once


@pytest.mark.parametrize("value,message", [
    ("lora:0", "--trainable = 'lora:0'"),
    ("frozen-layers:5-2", "expected all, lora:RANK"),
    ("frozen-layers:40", "layer 40 does not exist; llama3-8b has layers 0-31"),
])
def test_bad_trainable_values(value, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, ["compare", "--model", "llama3-8b", "--hardware", "h100-sxm", "--trainable", value])
    assert res.exit_code == 2
    assert message in res.stderr.replace("\n", " ") and "Traceback" not in res.output


def _ops_rows(trainable: str):
    """Chunk 0's operator rows under the per-operator model (the default on H100)."""
    from simtrain.costs.ops import chunk_breakdown, ops_runtime
    par = ParallelConfig(tp=2, pp=2, microbatches=2, seq_len=S, trainable=trainable)
    rt = ops_runtime(MODEL, par, H100, "flash", par.recompute, None, True)
    c = stage_costs(MODEL, par, H100, 2).chunks[0]
    return {o.name: o for o in chunk_breakdown(rt.ctx, c.layers, c.has_embedding, c.has_head,
                                                 c.params - c.frozen_params, {})}, rt, par


def test_frozen_layers_run_no_weight_pass_under_the_per_operator_model():
    """The reviewer's case: every layer frozen left W at full cost under ops (flat dropped it)."""
    full, _, _ = _ops_rows("all")
    frozen, _, _ = _ops_rows("frozen-layers:0-15")  # chunk 0 holds layers 0-15
    for name in ("qkv", "attn_out", "ffn_up", "ffn_down"):
        assert full[name].seconds[2] > 0 and frozen[name].seconds[2] == 0.0
        assert frozen[name].seconds[:2] == full[name].seconds[:2] and frozen[name].kernels[2] == 0
    c = stage_costs(MODEL, ParallelConfig(tp=2, pp=2, microbatches=2, seq_len=S, trainable="frozen-layers:0-15"),
                    H100, 2).chunks[0]  # only the embedding's gradient is accumulated
    assert frozen["grad_accum"].seconds[2] == pytest.approx(full["grad_accum"].seconds[2] * (c.params - c.frozen_params)
                                                            / c.params)
    half, _, _ = _ops_rows("frozen-layers:0-7")
    assert half["qkv"].seconds[2] == pytest.approx(full["qkv"].seconds[2] / 2)
    assert "lora" not in frozen


def test_lora_prices_its_adapters_at_the_unsplit_rank_and_freezes_the_base_weights():
    rows, _, par = _ops_rows("lora:16")
    assert rows["qkv"].seconds[2] == 0.0 and rows["embedding"].seconds[2] == 0.0
    lora = rows["lora"]
    assert all(x > 0 for x in lora.seconds)
    # A whole for column-parallel layers (K = h), B whole for row-parallel ones (r never split)
    from simtrain.costs.layers import linear_layers
    h, r, tp = MODEL.hidden_size, 16, par.tp
    per_token = sum(2 * mult * ((k * r + r * n / tp) if k == h else (k / tp * r + r * n))
                    for k, n, mult in linear_layers(MODEL, 0))
    tokens = S  # one sequence per microbatch, no sequence parallelism: every TP rank sees all tokens
    assert lora.flops[0] == pytest.approx(per_token * tokens * 16)  # chunk 0: layers 0-15


@pytest.mark.parametrize("trainable", ["lora:16", "frozen-layers:0-15", "frozen-layers:0-31"])
def test_memory_breakdown_counts_gradients_of_trainable_weights_only(trainable):
    """A review found LoRA's breakdown with full-size gradients and -1.8 GiB of optimizer states."""
    m, h = load_model("llama3-8b"), load_profile("h100-sxm")
    full = run_schedule("1f1b", m, h, ParallelConfig(tp=8, microbatches=4)).report.memory_breakdown_bytes[0]
    p = ParallelConfig(tp=8, microbatches=4, trainable=trainable)
    run = run_schedule("1f1b", m, h, p)
    part = run.report.memory_breakdown_bytes[0]
    assert all(v >= 0 for v in part.values()), part
    assert part["weights"] == pytest.approx(full["weights"], rel=0.01)
    assert part["gradients"] < full["gradients"]
    # mixed-precision Adam: 12 optimizer bytes per 2 gradient bytes of every trainable weight
    assert part["optimizer_states"] == pytest.approx(6 * part["gradients"], rel=1e-6)
    assert sum(part.values()) == pytest.approx(max(run.report.peak_memory_bytes))


def test_a_forward_only_step_holds_the_weights_alone():
    """Inference / rollout: no gradients and no optimizer states in HBM (a review found a
    forward-only step charged 1.9 GiB of gradients and 11.2 GiB of Adam states)."""
    m, h = load_model("llama3-8b"), load_profile("h100-sxm")
    train = run_schedule("1f1b", m, h, ParallelConfig(tp=8, microbatches=4)).report.memory_breakdown_bytes[0]
    run = run_schedule("1f1b", m, h, ParallelConfig(tp=8, microbatches=4, forward_only=True))
    part = run.report.memory_breakdown_bytes[0]
    assert part["gradients"] == part["optimizer_states"] == 0.0
    assert part["weights"] == train["weights"] > 0
    assert max(run.report.peak_memory_bytes) < train["weights"] + train["gradients"] + train["optimizer_states"]
