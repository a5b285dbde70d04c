"""Stored activations of eager torchtitan blocks (``kernels: eager``, :mod:`simtrain.costs.saved`)
and the gradients torch allocates at a stage's first backward (``grad_allocation``)."""

from __future__ import annotations

import pytest
import yaml

from simtrain.costs.layers import layer_shape
from simtrain.costs.ops import published_runtime
from simtrain.costs.saved import LSE, applies, eager_head_bytes, eager_layer_bytes
from simtrain.hardware import load_profile
from simtrain.models import load_model
from simtrain.parallel import ParallelConfig
from simtrain.published import run_suite, suite_path
from simtrain.scenario import run_schedule

R3 = "R3-torchtitan-llama3-8b-pp8"


def _hand_count_fp32(h: int, heads: int, d: int, f: int) -> dict[str, int]:
    """Elements per token autograd keeps for one fp32 torchtitan block (95677cb), tensor by tensor
    as read from the code: norms.py RMSNorm (pow and x * rsqrt save x; rsqrt saves its output; * weight
    saves the normalised x; the next linear saves the output), model.py Attention (rotary's
    multiply saves only the freqs_cis buffer; SDPA saves q, the repeat_kv copies of k and v, its
    output, which wo saves too, and its log-sum-exp), FeedForward (silu saves w1's output; the
    product saves silu's and w3's outputs; w2 saves the product)."""
    norm = {"x": h, "rsqrt": 1, "x * rsqrt": h, "* weight": h}
    return {
        "attention_norm": sum(norm.values()),
        "attention": sum({"q": heads * d, "k repeated": heads * d, "v repeated": heads * d, "out": heads * d}.values()),
        LSE: heads,
        "ffn_norm": sum(norm.values()),
        "ffn": sum({"w1 out": f, "silu out": f, "w3 out": f, "w1 * w3": f}.values()),
    }


def test_eager_bytes_per_operator_match_a_hand_count_of_torchtitans_block():
    m = load_model("llama3-8b")
    h, f = m.hidden_size, m.ffn_hidden_size
    hand = _hand_count_fp32(h, m.num_heads, m.q_head_dim, f)
    got = eager_layer_bytes(m, 4)
    assert got.keys() == hand.keys()
    for op, elements in hand.items():
        assert got[op] == 4 * elements, op
    assert sum(hand.values()) == 24 * h + m.num_heads + 2  # 10 h + 4 f with f = 3.5 h
    # 16-bit: x.float() is the saved fp32 copy; rsqrt in fp32; the cast back and the output in bf16
    assert eager_layer_bytes(m, 2)["ffn_norm"] == 4 * h + 4 + 2 * 2 * h
    assert eager_layer_bytes(m, 2)["ffn"] == 2 * 4 * f
    assert eager_head_bytes(m, 4) == 4 * (3 * h + 1) + 8 * m.vocab_size  # norm, logits, log-softmax


def test_eager_stores_more_than_the_fused_count_and_only_where_the_count_applies():
    m = load_model("llama3-8b")
    h = m.hidden_size
    fused, eager = (layer_shape(m, 0, 512, 1, 4, eager=e) for e in (False, True))
    assert fused.act_bytes == pytest.approx(4 * 17 * h)  # Korthikanti et al. 2022 for this Llama
    assert eager.act_bytes == pytest.approx(4 * (24 * h + 2))
    assert eager.lse_bytes == fused.lse_bytes == eager_layer_bytes(m, 4)[LSE]
    assert eager.input_bytes == fused.input_bytes and eager.w_bytes == fused.w_bytes
    # TP without sequence parallelism: each norm group stays whole on every rank
    tp2 = layer_shape(m, 0, 512, 2, 4, eager=True)
    assert tp2.shared_bytes == pytest.approx(2 * (4 * h + 4 + 8 * h))
    for other in (m.model_copy(update=dict(activation="gelu")), m.model_copy(update=dict(norm="layernorm")),
                  load_model("deepseek-v3")):
        assert not applies(other, other.num_layers - 1)
        a, b = (layer_shape(other, other.num_layers - 1, 512, 1, 2, eager=e) for e in (False, True))
        assert a == b


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_both_cost_models_store_the_eager_count_and_full_recompute_only_the_input(recompute):
    model, hw = load_model("llama3-8b").model_copy(update=dict(vocab_size=2256)), load_profile("h100-sxm")
    base = dict(pp=2, microbatches=4, seq_len=512, dtype="fp32", recompute=recompute)
    chunks = {}
    for kernels in ("fused", "eager"):
        par = ParallelConfig(**base, kernels=kernels)
        flat = run_schedule("1f1b", model, hw, par)
        ops = run_schedule("1f1b", model, hw, par, runtime=published_runtime(model, par, hw))
        assert [c.activation_bytes for c in flat.costs.chunks] == [c.activation_bytes for c in ops.costs.chunks]
        chunks[kernels] = flat.costs.chunks
    tokens, layers, h = 512, len(chunks["fused"][0].layers), model.hidden_size
    fused, eager = chunks["fused"][0].activation_bytes, chunks["eager"][0].activation_bytes
    if recompute == "full":
        assert eager == fused == tokens * layers * h * 4
    else:
        lse = 4 * model.num_heads if recompute == "none" else 0
        assert fused == pytest.approx(tokens * layers * (4 * 17 * h + lse))
        assert eager == pytest.approx(tokens * layers * (4 * (24 * h + 2) + lse))


def _r3_rows(tmp_path, **settings):
    data = yaml.safe_load(suite_path().read_text())
    case = next(c for c in data["cases"] if c["name"] == R3)
    case["settings"].update(settings)
    path = tmp_path / "runs.yaml"
    path.write_text(yaml.safe_dump(data))
    return {r.label: r.predicted for r in run_suite(published_runtime, path=path, cases=[R3])}


def test_r3_runs_eager_and_eager_raises_only_its_no_ac_figures(tmp_path):
    shipped = _r3_rows(tmp_path)
    fused = _r3_rows(tmp_path, kernels="fused")
    assert _r3_rows(tmp_path, kernels="eager") == shipped  # the shipped case is eager (compile = false)
    # every R3 peak falls in a steady state after each chunk's first backward (or at the step):
    # allocating the gradients there lowers them by less than one 8 MiB activation
    static = _r3_rows(tmp_path, grad_allocation="static")
    assert all(0 <= static[k] - shipped[k] <= 512 * 4096 * 4 / 2**30 for k in shipped)
    for label, value in shipped.items():
        if "full AC" in label:
            assert value == pytest.approx(fused[label])
        else:
            assert value > 1.05 * fused[label]


def _lazy_runs(schedule, **extra):
    model, hw = load_model("llama3-8b").model_copy(update=dict(vocab_size=2256)), load_profile("h100-sxm")
    base = dict(pp=4, microbatches=8, seq_len=512, dtype="fp32", recompute="none", **extra)
    return {g: run_schedule(schedule, model, hw, ParallelConfig(**base, grad_allocation=g))
            for g in ("static", "first-backward")}


def test_gpipe_lazy_gradients_lower_the_peak_by_what_the_first_backward_frees_or_allocates():
    """GPipe peaks when its forwards end. With lazy gradients, nothing is allocated then, and the
    first B's end adds the chunk's gradients while freeing one microbatch's activations: the peak
    falls by the smaller of the two."""
    runs = _lazy_runs("gpipe")
    costs = runs["static"].costs
    for rank in range(4):
        grads, act = costs.chunks[rank].params * 4, costs.chunks[rank].activation_bytes  # fp32 gradients
        assert runs["first-backward"].costs.lazy_grad_bytes([rank]) == pytest.approx(grads)
        static, lazy = (runs[g].report.peak_memory_bytes[rank] for g in ("static", "first-backward"))
        assert lazy == pytest.approx(static - min(grads, act))
        part = runs["first-backward"].report.memory_breakdown_bytes[rank]
        assert part["gradients"] == pytest.approx(grads if grads > act else 0.0)
        assert sum(part.values()) == pytest.approx(lazy)
    for g in runs:  # the step still holds every gradient when the optimizer runs
        assert max(runs[g].result.memory_columns["bytes"][runs[g].result.memory_columns["rank"] == 0]) >= \
            costs.static_bytes([0])


@pytest.mark.parametrize("schedule", ["1f1b", "interleaved-zb"])
def test_lazy_gradients_start_lower_and_are_all_held_by_the_optimizer_step(schedule):
    runs = _lazy_runs(schedule, **({"vp": 2, "w_pending": "autograd"} if schedule == "interleaved-zb" else {}))
    mem = {g: runs[g].result.memory_columns for g in runs}
    held = [runs["static"].schedule.chunk_of(s) for s in runs["static"].schedule.stages_of(0)]
    first = {g: mem[g]["bytes"][mem[g]["rank"] == 0][0] for g in runs}
    assert first["first-backward"] == pytest.approx(first["static"] - runs["first-backward"].costs.lazy_grad_bytes(held))
    # a steady state follows the first backward of every chunk, so the peak level is reached again
    assert runs["first-backward"].report.peak_memory_bytes == pytest.approx(runs["static"].report.peak_memory_bytes)
    for rank, part in enumerate(runs["first-backward"].report.memory_breakdown_bytes):
        assert sum(part.values()) == pytest.approx(runs["first-backward"].report.peak_memory_bytes[rank])


def test_lazy_gradients_need_torch_without_ddp_or_fsdp():
    from simtrain.cli.settings import parallel_from
    from simtrain.errors import SimtrainError

    for bad in ({"dp": 2}, {"zero_stage": 1}):
        with pytest.raises(SimtrainError, match="grad_allocation 'first-backward'.*DDP/FSDP"):
            parallel_from({"grad_allocation": "first-backward", **bad}, {}, "job.yaml")
    with pytest.raises(SimtrainError, match="parallel.grad_allocation.*'static' or 'first-backward'"):
        parallel_from({"grad_allocation": "never"}, {}, "job.yaml")


def test_stage_buffers_per_microbatch_follow_torch_pipelining_stage():
    from simtrain.costs.pipelining import stage_buffers

    p, m = 8.0, 16
    first, middle, last = (stage_buffers(p, m, f, l, True, False) for f, l in ((True, False), (False, False),
                                                                              (False, True)))
    assert (first.static, middle.static, last.static) == (m * p, 2 * m * p, m * p)  # grad recv; both; act recv
    # the kept output adds one activation; the received input is the buffer, not a second copy
    assert (first.activation_delta, middle.activation_delta, last.activation_delta) == (p, 0.0, -p)
    assert stage_buffers(p, m, False, False, False, False).activation_delta == p  # eager bf16 saves a copy
    assert stage_buffers(p, m, False, True, True, True).held_delta == -p  # the autograd graph holds the input


def test_per_microbatch_buffers_are_static_comm_buffers_and_change_each_chunks_activations():
    model, hw = load_model("llama3-8b").model_copy(update=dict(vocab_size=2256)), load_profile("h100-sxm")
    base = dict(pp=4, microbatches=8, seq_len=512, dtype="fp32", recompute="none")
    runs = {b: run_schedule("1f1b", model, hw, ParallelConfig(**base, pp_buffers=b))
            for b in ("per-transfer", "per-microbatch")}
    old, new = (runs[b].costs.chunks for b in runs)
    p2p = 512 * model.hidden_size * 4
    assert [n.activation_bytes - o.activation_bytes for o, n in zip(old, new)] == pytest.approx([p2p, 0, 0, -p2p])
    assert [c.recv_buffer_bytes for c in new] == [8 * p2p, 16 * p2p, 16 * p2p, 8 * p2p]
    for rank in range(4):
        part = runs["per-microbatch"].report.memory_breakdown_bytes[rank]
        assert part["comm_buffers"] == new[rank].recv_buffer_bytes
        assert sum(part.values()) == pytest.approx(runs["per-microbatch"].report.peak_memory_bytes[rank])
        assert runs["per-transfer"].report.memory_breakdown_bytes[rank]["comm_buffers"] == 0.0


def test_r3_receive_buffers_add_three_buffers_per_microbatch_to_the_full_ac_step_peak(tmp_path):
    without = _r3_rows(tmp_path, pp_buffers="per-transfer")
    shipped = _r3_rows(tmp_path)
    assert _r3_rows(tmp_path, pp_buffers="per-microbatch") == shipped
    # rank 0 holds stages 0 (output-gradient buffers) and 8 (input and output-gradient buffers),
    # 16 microbatches of 512 x 4096 fp32 each; its full-AC peak is the optimizer step
    label = "Interleaved1F1B rank 0, full AC"
    assert shipped[label] - without[label] == pytest.approx(3 * 16 * 512 * 4096 * 4 / 2**30)
    assert all(shipped[k] > without[k] for k in shipped)
