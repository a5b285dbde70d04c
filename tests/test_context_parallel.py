"""Context parallelism (--cp, --cp-kind): per-GPU work and memory divided by cp, the declared
collectives of ring / all-gather / Ulysses against their formulas, ring overlap, placement and the
error lines for impossible settings."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from simtrain.cli import app
from simtrain.costs import stage_costs
from simtrain.hardware import load_profile
from simtrain.lowering.chains import cp_seconds
from simtrain.models import load_model
from simtrain.network import Collective, Topology
from simtrain.parallel import ParallelConfig
from simtrain.scenario import run_schedule

H100 = load_profile("h100-sxm")
MODEL = load_model("llama3-8b")
S = 8192


def _costs(cp: int, kind: str = "ring", **kw):
    par = ParallelConfig(tp=2, pp=2, cp=cp, cp_kind=kind, seq_len=S, **kw)
    return par, stage_costs(MODEL, par, H100, 2)


def test_cp_divides_flops_activations_and_messages():
    """Each CP rank holds s/cp tokens; with causal load balancing it does 1/cp of the attention."""
    _, one = _costs(1)
    _, four = _costs(4)
    for a, b in zip(one.chunks, four.chunks):
        assert b.forward_flops == pytest.approx(a.forward_flops / 4)
        assert b.backward_weight_flops == pytest.approx(a.backward_weight_flops / 4)
        assert b.activation_bytes == pytest.approx(a.activation_bytes / 4)
        assert b.p2p_bytes == pytest.approx(a.p2p_bytes / 4)
    assert four.tokens_per_microbatch == one.tokens_per_microbatch == S


def test_ring_moves_the_full_sequence_kv_per_layer_and_hides_behind_attention():
    """Ring attention: per layer a ring all-gather of the sequence's K and V (s x kv_heads/tp x
    (d_k + d_v) x 2 bytes), twice that in the backward; (cp-1)/cp of attention hides it."""
    par, costs = _costs(4)
    c = costs.chunks[0]
    kv = S * MODEL.kv_heads / 2 * (MODEL.q_head_dim + MODEL.v_head_dim) * 2
    (fwd,), (bwd,) = c.cp_forward, c.cp_backward
    assert (fwd.op, fwd.dim, fwd.nbytes, fwd.repeat) == ("all-gather", "cp", pytest.approx(kv), len(c.layers))
    assert bwd.nbytes == pytest.approx(2 * kv)
    attn_rate = H100.attention_flops_per_s(S, MODEL.q_head_dim, "bf16", backward=False)
    per_layer_attn_flops = 4 * S * MODEL.num_heads / 2 * MODEL.q_head_dim * S / 4  # tokens s/cp
    assert c.cp_hide_forward_s == pytest.approx(3 / 4 * len(c.layers) * per_layer_attn_flops / attn_rate)
    topo = Topology(H100, par)
    assert cp_seconds(c, "F", topo, 0) == pytest.approx(max(0.0, topo.seconds(fwd, 0) - c.cp_hide_forward_s))


def test_allgather_and_ulysses_declarations():
    _, ag = _costs(4, "allgather")
    c = ag.chunks[1]
    assert [x.op for x in c.cp_forward] == ["all-gather"]
    assert [x.op for x in c.cp_backward] == ["all-gather", "reduce-scatter"]
    assert c.cp_hide_forward_s == c.cp_hide_backward_s == 0.0
    _, ul = _costs(2, "ulysses")
    (a2a,) = ul.chunks[1].cp_forward
    tokens = S / 2
    q_o = tokens * MODEL.num_heads / 2 * (MODEL.q_head_dim + MODEL.v_head_dim) * 2
    kv = tokens * MODEL.kv_heads / 2 * (MODEL.q_head_dim + MODEL.v_head_dim) * 2
    assert (a2a.op, a2a.nbytes) == ("all-to-all", pytest.approx(q_o + kv))


def test_cp_group_inside_a_node_first_and_gradients_over_dp_x_cp():
    par = ParallelConfig(tp=2, cp=4, pp=2, dp=3)
    assert par.world_size == 2 * 4 * 2 * 3
    g = par.group("cp", 1)
    assert g.size == 4 and g.span == (8, 8 + 3 * 2)  # pp rank 1 starts after tp x cp GPUs
    assert par.group("dp", 0).size == 12
    topo = Topology(H100, par)
    assert topo.route(Collective("all-gather", "cp", 1.0), 0).link.name == H100.intra_node.name


def test_ulysses_all_to_all_splits_over_nvlink_and_nics():
    """A uniform all-to-all keeps 1/n local and sends 1/n to each member: inside one node all over
    NVLink; a group spanning two nodes of 8 GPUs (tp 4 x cp 4) sends 1/4 over NVLink, 2/4 over NICs."""
    one_node = Topology(H100, ParallelConfig(tp=2, cp=4))
    parts = {p.link: p.nbytes for p in one_node.all_to_all(Collective("all-to-all", "cp", 400.0))}
    assert parts == {"nvlink": pytest.approx(300.0)}
    two_nodes = Topology(H100, ParallelConfig(tp=4, cp=4))
    parts = {p.link: p.nbytes for p in two_nodes.all_to_all(Collective("all-to-all", "cp", 400.0))}
    assert parts == {"nvlink": pytest.approx(100.0), "nic": pytest.approx(200.0)}


def test_cp_streams_appear_in_their_own_lane_and_throughput_counts_whole_sequences():
    par = ParallelConfig(tp=2, pp=2, cp=2, cp_kind="allgather", dp=2, microbatches=4, seq_len=S)
    run = run_schedule("1f1b", MODEL, H100, par)
    t = run.result.trace
    cp_tasks = t[t["kind"] == "cp"]
    assert len(cp_tasks) > 0 and set(cp_tasks["stream"]) == {"cp"}
    assert run.report.gpus == 2 * 2 * 2 * 2
    assert run.report.tokens_per_s * run.report.step_time_s == pytest.approx(2 * 4 * S)


@pytest.mark.parametrize("args,message", [
    (["--cp", "3"], "--cp 3: 2 x cp = 6 must divide the sequence length 8192"),
    (["--cp", "4", "--cp-kind", "ulysses", "--tp", "4"], "tp x cp = 16 must divide the model's 8 KV heads"),
    (["--cp", "2", "--cp-kind", "zigzag"], "--cp-kind = 'zigzag'"),
    (["--cp", "0"], "--cp = 0"),
])
def test_impossible_cp_settings_give_one_error_line(args, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, ["compare", "--model", "llama3-8b", "--hardware", "h100-sxm", "--seq-len", "8192",
                                   "--microbatches", "4", "--pp", "2", *args])
    assert res.exit_code == 2
    assert message in res.stderr.replace("\n", " ") and "Traceback" not in res.output


@pytest.mark.parametrize("kind", ["ring", "allgather", "ulysses"])
def test_the_per_operator_model_divides_by_cp_like_the_flat_one(kind):
    """Per-operator FLOPs of a chunk equal the flat model's model FLOPs at every CP degree (the
    per-operator model once costed whole sequences per GPU, 16x too much at cp 16), and MFU =
    HFU when nothing is recomputed."""
    from simtrain.cost_models import CostChoice, hfu
    from simtrain.costs.ops import chunk_breakdown, ops_runtime

    for cp in (1, 4):
        par = ParallelConfig(tp=2, pp=2, cp=cp, cp_kind=kind, seq_len=S, microbatches=4, recompute="none")
        rt = ops_runtime(MODEL, par, H100)
        costs = stage_costs(MODEL, par, H100, 2)
        for c in costs.chunks:
            ops = chunk_breakdown(rt.ctx, c.layers, c.has_embedding, c.has_head, c.params)
            assert sum(o.flops[0] for o in ops) == pytest.approx(c.forward_flops, rel=1e-9)
        run = run_schedule("1f1b", MODEL, H100, par, runtime=rt)
        assert hfu(run, MODEL, par, H100, CostChoice("ops")) == pytest.approx(run.report.mfu)


def test_ring_overlap_is_bounded_by_the_per_operator_attention_time():
    """Under the per-operator model the KV ring hides behind (cp-1)/cp of *its* attention time."""
    from simtrain.costs.ops import ATTENTION_CORE, chunk_breakdown, ops_runtime

    par = ParallelConfig(tp=2, pp=2, cp=4, seq_len=S, microbatches=4, recompute="none")
    rt = ops_runtime(MODEL, par, H100)
    for c in rt(stage_costs(MODEL, par, H100, 2)).chunks:
        ops = chunk_breakdown(rt.ctx, c.layers, c.has_embedding, c.has_head, c.params)
        attn = sum(o.seconds[0] for o in ops if o.name in ATTENTION_CORE)
        assert c.cp_hide_forward_s == pytest.approx(3 / 4 * attn)
