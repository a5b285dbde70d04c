"""The cost model against the papers' closed forms."""

from __future__ import annotations

import pytest

from conftest import tiny_model
from simtrain.costs import split_layers, stage_costs
from simtrain.errors import SimtrainError
from simtrain.hardware import load_profile
from simtrain.models import load_model
from simtrain.network import Topology
from simtrain.parallel import ParallelConfig

H100 = load_profile("h100-sxm")


def _gpt_layer(recompute: str, tp: int = 1, s: int = 2048, b: int = 1):
    """Costs of one GPT-3-shaped layer: 96 layers cut into 96 one-layer chunks; chunk 1 is plain.
    Attention is unfused (materialised scores), the setting of Korthikanti et al. 2022."""
    model = load_model("gpt3-175b")
    par = ParallelConfig(tp=tp, microbatch_size=b, seq_len=s, recompute=recompute, attention="unfused")
    return model, stage_costs(model, par, H100, 96).chunks[1]


def test_flops_match_zero_bubble_table_1():
    model, c = _gpt_layer("none")
    s, b, h = 2048, 1, model.hidden_size
    # Qi et al. 2024 Table 1: F = sbh(24h + 4s), B (input grad) = sbh(24h + 8s), W = sbh(24h).
    # GPT-3 has biases, which the table leaves out: allow 0.1%.
    assert c.forward_flops == pytest.approx(s * b * h * (24 * h + 4 * s), rel=1e-3)
    assert c.backward_input_flops == pytest.approx(s * b * h * (24 * h + 8 * s), rel=1e-3)
    assert c.backward_weight_flops == pytest.approx(s * b * h * 24 * h, rel=1e-3)
    assert c.forward_s == pytest.approx(c.forward_flops / H100.achieved_flops("bf16"))


def test_activation_memory_matches_korthikanti():
    model, none = _gpt_layer("none")
    s, b, h, a = 2048, 1, model.hidden_size, model.num_heads
    # Korthikanti et al. 2022 eq. (1): sbh(34 + 5as/h) bytes per layer without recomputation.
    assert none.activation_bytes == pytest.approx(s * b * h * (34 + 5 * a * s / h))
    _, sel = _gpt_layer("selective")
    assert sel.activation_bytes == pytest.approx(34 * s * b * h)  # §5: selective drops 5as/h
    _, full = _gpt_layer("full")
    assert full.activation_bytes == pytest.approx(2 * s * b * h)  # full: only the layer input
    assert full.backward_input_s > sel.backward_input_s  # full reruns the forward
    _, tp8 = _gpt_layer("selective", tp=8)
    assert tp8.activation_bytes == pytest.approx(34 * s * b * h / 8)  # sequence parallelism, eq. (5)
    # Zero Bubble Table 1: what W needs after I is 32 sbh.
    assert sel.weight_grad_bytes == pytest.approx(32 * s * b * h, rel=1e-3)


def test_split_layers_uneven_goes_to_the_middle():
    assert split_layers(126, 16) == [7] + [8] * 14 + [7]  # the Llama 3 405B layout
    assert split_layers(80, 8) == [10] * 8
    assert split_layers(10, 4) == [2, 3, 3, 2]
    assert split_layers(13, 4) == [3, 4, 3, 3]
    with pytest.raises(SimtrainError, match="40 pipeline stages for a model of 32 layers"):
        split_layers(32, 40)


def test_first_and_last_stages_are_uneven():
    model = load_model("llama3-70b")
    costs = stage_costs(model, ParallelConfig(tp=8, pp=8), H100, 8).chunks
    mid = costs[3]
    assert costs[0].params > mid.params  # embedding
    assert costs[-1].params > mid.params and costs[-1].forward_s > mid.forward_s  # LM head
    assert costs[-1].activation_bytes > mid.activation_bytes  # fp32 logits
    assert mid.forward_s == pytest.approx(costs[4].forward_s)


def test_tensor_parallel_divides_compute_and_adds_collectives():
    model = load_model("llama3-70b")
    one = stage_costs(model, ParallelConfig(tp=1), H100, 80).chunks[1]
    eight = stage_costs(model, ParallelConfig(tp=8), H100, 80).chunks[1]
    assert eight.forward_flops == pytest.approx(one.forward_flops / 8)
    assert one.tp_forward == ()
    (declared,) = eight.tp_forward
    # 4 reduce-scatters/all-gathers of s*b*h*2 bytes over 8 GPUs on NVLink per layer, each NCCL's
    # ring/Simple (simtrain.collectives): 8.4 us + 7 x 3.4 us + 7/8 x bytes at the achieved NVLink rate
    nbytes = 8192 * 8192 * 2
    assert (declared.op, declared.dim, declared.nbytes, declared.repeat) == ("reduce-scatter", "tp", nbytes, 4)
    link = H100.intra_node
    per_op = (8.4 + 7 * 3.4) * 1e-6 + 7 / 8 * nbytes / link.achieved_bandwidth_bytes_per_s
    topo = Topology(H100, ParallelConfig(tp=8))
    assert topo.seconds(declared) == pytest.approx(4 * per_op)


def test_zero1_shards_optimizer_state():
    model = tiny_model()
    z0 = stage_costs(model, ParallelConfig(dp=8), H100, 4)
    z1 = stage_costs(model, ParallelConfig(dp=8, zero_stage=1), H100, 4)
    assert z0.static_bytes_per_param == 16  # 2 + 2 + 12 (Rajbhandari et al. 2020 §3.1)
    assert z1.static_bytes_per_param == pytest.approx(4 + 12 / 8)


def test_tp_must_divide_heads():
    with pytest.raises(SimtrainError, match="--tp 3: must divide the model's 64 attention heads"):
        stage_costs(load_model("llama3-70b"), ParallelConfig(tp=3), H100, 8)


def test_calibrated_rates_drive_the_cost_model():
    """Per-pass GEMM rates, attention rates, elementwise classes and layer slowdowns, by hand."""
    import dataclasses

    model = tiny_model(layers=3, num_heads=4, activation="gelu", norm="layernorm")  # h 256, f 1024, s 128
    par = ParallelConfig(microbatches=5, microbatch_size=2, seq_len=128, dtype="fp32", sequence_parallel=False,
                         recompute="none")
    rates = {"F": 50e9, "I": 40e9, "W": 25e9}
    hw = dataclasses.replace(
        H100,
        linear_rates={("fp32", k): ((256, 256, 256, r),) for k, r in rates.items()},
        attention_rates={"fp32": ((128, 64, 10e9, 5e9),)},
        elementwise_bytes_per_s={"norm": 1e9, "activation": 2e9, "add": 4e9},
        layer_slowdown={"F": 1.1, "B": 1.2, "I": 1.5, "W": 1.25},
    )
    c = stage_costs(model, par, hw, 3).chunks[1]
    tokens, h, f = 256, 256, 1024
    gemm = 2 * tokens * (h * 3 * h + h * h + 2 * h * f)  # QKV, output projection, FFN up and down
    attn = 4 * 128 * h * tokens  # 2·s·(a·d) for Q·Kᵀ and for softmax·V, per token
    ew_f = tokens * 4 * (4 * h / 1e9 + 2 * f / 2e9 + 6 * h / 4e9)
    ew_b = tokens * 4 * (6 * h / 1e9 + 3 * f / 2e9 + 6 * h / 4e9)
    accumulate = 4 / 5 * 3 * 4 * c.params / 4e9
    assert c.forward_s == pytest.approx(1.1 * (gemm / 50e9 + attn / 10e9 + ew_f))
    assert c.backward_input_s == pytest.approx(1.5 * (gemm / 40e9 + 2 * attn / 5e9 + ew_b))
    assert c.backward_weight_s == pytest.approx(1.25 * (gemm / 25e9 + accumulate))
    assert c.backward_s == pytest.approx(1.2 * (gemm / 40e9 + 2 * attn / 5e9 + ew_b + gemm / 25e9 + accumulate))
    # op-times replace everything, including the separate full-backward time
    fixed = stage_costs(model, par, hw, 3).with_op_times(1.0, 2.0, 3.0).chunks[1]
    assert fixed.backward_s == 5.0


@pytest.mark.parametrize("name, sp", [("llama3-8b", True), ("llama3-8b", False), ("deepseek-v3", True)])
def test_fp8_activation_cache_stores_linear_inputs_in_one_byte_and_a_scale(name, sp):
    """--activation-cache fp8 (DeepSeek-V3 §3.3.2): each linear layer's saved input costs 1 + 4/128
    bytes instead of 2, in the stored activations and in what W holds; output gradients stay BF16."""
    from simtrain.costs.layers import FP8_CACHE_BYTES, linear_layers

    model = load_model(name)
    s, tp = 4096, 2
    kw = dict(tp=tp, pp=2, microbatches=4, seq_len=s, recompute="none", sequence_parallel=sp)
    if model.moe is not None:
        kw.update(ep=8, dp=8)
    base, fp8 = (stage_costs(model, ParallelConfig(**kw, activation_cache=c), H100, 2) for c in ("compute", "fp8"))
    saved = 2 - FP8_CACHE_BYTES
    for a, b in zip(base.chunks, fp8.chunks):
        gemms = [linear_layers(model, layer) for layer in a.layers]
        inputs = sum(sum(k * mult for k, _n, mult in g) for g in gemms)
        inputs += 2 * model.hidden_size * model.mtp_depth if a.has_head else 0  # MTP projections' inputs
        shared = model.hidden_size if model.mla is not None else 0  # q/kv down projections read one x
        assert a.weight_grad_bytes - b.weight_grad_bytes == pytest.approx(saved * inputs * s / tp)
        extra = 0.0 if sp else saved * 2 * model.hidden_size * (1 - 1 / tp) * len(a.layers)  # replicated inputs
        assert a.activation_bytes - b.activation_bytes == pytest.approx(
            saved * (inputs - shared * len(a.layers)) * s / tp + extra * s)
        assert b.forward_s == a.forward_s and b.params == a.params
