"""Mixture-of-Experts with expert parallelism: costs, all-to-all bytes, placement, sub-operation
lowering (serial, waved, F&B pairing), forward-only steps, metrics and the CLI."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from conftest import balanced_moe, check_run, reference_schedule, tiny_moe, unpaired
from simtrain.cli import app
from simtrain.collectives import Group as Placement
from simtrain.collectives import estimate_group
from simtrain.costs import stage_costs
from simtrain.errors import SimtrainError
from simtrain.hardware import load_profile
from simtrain.models import load_model
from simtrain.moe import a2a_copies, expected_nodes, gpu_layer_params, routed_params
from simtrain.network import Topology
from simtrain.parallel import ParallelConfig
from simtrain.scenario import run_schedule
from simtrain.schedules import ScheduleError, generate, split_name
from simtrain.schedules.ir import Action, OverlapAction

H800 = load_profile("h800")
ROOT = Path(__file__).resolve().parent.parent
T, K, H = 128, 4, 256  # tokens per microbatch (b = 1, s = 128), top-k, hidden of tiny_moe


def block(parallel: ParallelConfig, model=None, chunk: int = 1):
    """The first MoE block of ``chunk`` (2 chunks of tiny_moe: layers 0-1 and 2-3)."""
    costs = stage_costs(model or tiny_moe(), parallel, H800, 2)
    return costs.chunks[chunk].moe.blocks[0]


# --------------------------------------------------------------------------- all-to-all bytes
def test_a2a_bytes_ep_inside_one_node():
    # EP 8 on one 8-GPU node: of k copies, 1/8 stays local, 7/8 go over NVLink, none over the NICs
    b = block(ParallelConfig(pp=2, dp=8, ep=8))
    assert b.dispatch.total_bytes == T * K * H * 2 == 262144
    assert b.dispatch.link_bytes("nvlink") == T * K * 7 / 8 * H * 2 == 229376
    assert b.dispatch.link_bytes("nic") == 0 and [p.link for p in b.dispatch.parts] == ["nvlink"]
    nv = H800.intra_node  # at the achieved NVLink rate: 200 GB/s x 0.824 (NCCL's per-link constant)
    assert b.dispatch.parts[0].transfer_s == pytest.approx(229376 / nv.achieved_bandwidth_bytes_per_s)
    assert b.dispatch.seconds == pytest.approx(nv.latency_s + 229376 / (200e9 * 0.824))
    assert b.combine == b.dispatch  # BF16 both ways
    fp8 = block(ParallelConfig(pp=2, dp=8, ep=8, dispatch_dtype="fp8"))
    assert fp8.dispatch.link_bytes("nvlink") == 229376 / 2 and fp8.combine.link_bytes("nvlink") == 229376


def test_a2a_bytes_ep_across_two_nodes():
    # EP 16 = 2 nodes x 8: 1/16 local, 7/16 NVLink, 8/16 InfiniBand
    b = block(ParallelConfig(pp=2, dp=16, ep=16))
    assert b.dispatch.link_bytes("nvlink") == T * K * 7 / 16 * H * 2 == 114688
    assert b.dispatch.link_bytes("nic") == T * K * 8 / 16 * H * 2 == 131072
    nic = [p for p in b.dispatch.parts if p.link == "nic"][0]
    assert nic.transfer_s == pytest.approx(131072 / (50e9 * 0.94)) and nic.latency_s == pytest.approx(8e-6)
    # TP 2 (sequence parallel): each GPU routes half the tokens; EP 16 still spans dp x tp = 16 GPUs
    b_tp = block(ParallelConfig(pp=2, dp=8, tp=2, ep=16))
    assert b_tp.dispatch.link_bytes("nic") == 131072 / 2


def test_node_limited_routing_crosses_infiniband_once_per_remote_node():
    # M = 1 node per token out of 2: the token crosses IB with probability 1/2, once; NVLink then
    # forwards to the k experts' GPUs, of which 1/8 is the landing GPU itself
    b = block(ParallelConfig(pp=2, dp=16, ep=16, node_limit=1))
    assert b.dispatch.link_bytes("nic") == T * 0.5 * H * 2 == 32768
    assert b.dispatch.link_bytes("nvlink") == T * K * 7 / 8 * H * 2 == 229376
    # DeepSeek-V3 (k = 8 of 256 experts, EP 64 = 8 nodes x 8, M = 4): 3.63 distinct nodes
    assert expected_nodes(8, 32, 8, 4) == pytest.approx(3.629, abs=1e-3)
    copies = a2a_copies(8, 64, 8, 8, 4, experts_per_gpu=4)
    assert copies["nic"] == pytest.approx(expected_nodes(8, 32, 8, 4) * 7 / 8)
    assert a2a_copies(8, 64, 8, 8, None)["nic"] == 7.0  # direct: 8 x 56/64


def test_a2a_bytes_appear_in_the_simulated_trace():
    par = ParallelConfig(pp=2, dp=16, ep=16, microbatches=2)
    run = run_schedule("1f1b", tiny_moe(), H800, par)
    trace = run.result.trace
    a2a = trace[trace["kind"] == "a2a"]
    one = a2a[a2a["name"].str.startswith("dispatch 1F0 L2")]
    assert sorted(one["name"].str.split().str[-1]) == ["nic", "nvlink"]
    assert one.set_index(one["name"].str.split().str[-1])["bytes"].to_dict() == {"nic": 131072, "nvlink": 114688}
    # rank 1 holds MoE layers 2 and 3: per microbatch 2 all-to-alls in F and 2 in B per layer
    per_rank = a2a.groupby("rank")["bytes"].sum()
    assert per_rank[1] == pytest.approx(2 * 2 * 4 * (131072 + 114688))
    assert per_rank[0] == pytest.approx(1 * 2 * 4 * (131072 + 114688))  # layer 0 is dense


# --------------------------------------------------------------------------- costs and memory
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_segments_add_up_to_the_chunk_costs(recompute):
    par = ParallelConfig(pp=16, dp=128, ep=64, recompute=recompute, expert_imbalance=1.25, dispatch_dtype="fp8")
    costs = stage_costs(load_model("deepseek-v3"), par, H800, 16)
    assert costs.chunks[0].moe is None  # layers 0-2 are dense
    for ch in costs.chunks[1:]:
        segs = ch.moe.segments
        assert len(ch.moe.blocks) == len(ch.layers) and segs[-1].block is None
        f = sum(s.forward_s + (s.block.expert_forward_s if s.block else 0) for s in segs)
        replay = recompute == "full"  # backward replays each block's expert forward
        i = sum(s.backward_input_s + s.recompute_s
                + (s.block.expert_backward_input_s + replay * s.block.expert_forward_s if s.block else 0)
                for s in segs)
        w = sum(s.backward_weight_s + (s.block.expert_backward_weight_s if s.block else 0) for s in segs)
        assert (f, i, w) == pytest.approx((ch.forward_s, ch.backward_input_s, ch.backward_weight_s), rel=1e-12)
    base = stage_costs(load_model("deepseek-v3"), par.model_copy(update={"expert_imbalance": 1.0}), H800, 16)
    b, b1 = costs.chunks[5].moe.blocks[0], base.chunks[5].moe.blocks[0]
    assert b.expert_forward_s == pytest.approx(1.25 * b1.expert_forward_s)
    assert b.dispatch.parts[-1].transfer_s == pytest.approx(1.25 * b1.dispatch.parts[-1].transfer_s)
    assert costs.chunks[5].forward_flops == base.chunks[5].forward_flops  # useful FLOPs unchanged


def test_deepseek_v3_experts_are_sharded_over_ep():
    model = load_model("deepseek-v3")
    par = ParallelConfig(pp=16, dp=128, ep=64, zero_stage=1)
    costs = stage_costs(model, par, H800, 16)
    ch = costs.chunks[5]
    expert = 3 * 7168 * 2048  # one SwiGLU expert
    assert routed_params(model, ch.layers[0]) == 256 * expert
    assert ch.expert_params == len(ch.layers) * 4 * expert  # 256 / 64 = 4 experts per GPU
    dense = sum(model.layer_params(layer) - 256 * expert for layer in ch.layers)
    assert ch.params == dense + ch.expert_params
    assert gpu_layer_params(model, 0, par) == (model.layer_params(0), 0.0)  # dense layer
    # ZeRO-1: optimizer states of dense params over DP 128, of experts over expert-DP 128 / 64 = 2
    assert costs.static_bytes([5]) == pytest.approx(dense * (4 + 12 / 128) + ch.expert_params * (4 + 12 / 2))
    # without EP the experts are replicated (tp = 1): 64x more expert parameters per GPU
    plain = stage_costs(model, ParallelConfig(pp=16, dp=128), H800, 16).chunks[5]
    assert plain.params - dense == pytest.approx(64 * ch.expert_params) and plain.expert_params == 0


def test_ep_places_stages_outermost_so_an_ep_group_fills_whole_nodes():
    par = ParallelConfig(pp=16, dp=128, ep=64)
    topo = Topology(H800, par)
    assert par.gpu_id(1) == 128 and par.gpu_id(0, dp_rank=1) == 1
    assert topo.ep_placement(0) == (8, 8) and topo.ep_placement(15) == (8, 8)
    assert topo.p2p(0, 1).link.name == H800.inter_node.name  # stages on different nodes
    assert topo.dp_route(3).link.name == H800.inter_node.name
    assert topo.expert_dp_route(0).link.name == H800.inter_node.name  # 2 GPUs 64 apart
    assert Topology(H800, ParallelConfig(pp=2, dp=8, ep=8)).ep_placement(1) == (8, 1)
    assert ParallelConfig(pp=16, dp=128).gpu_id(1) == 1  # dense: [TP, PP, DP] as before


def test_expert_gradients_are_reduced_over_the_expert_dp_group():
    par = ParallelConfig(pp=2, dp=32, ep=16, microbatches=2, dp_buckets=1)
    # FIFO links: the reduction's trace interval is then its priced time (shared, the all-to-alls
    # and sends beside it on the NIC stretch it: simtrain.link_share)
    fifo = replace(H800, inter_node=replace(H800.inter_node, sharing="fifo"))
    run = run_schedule("1f1b", tiny_moe(), fifo, par)
    ch = run.costs.chunks[1]
    dp = run.result.trace[(run.result.trace["kind"] == "dp") & (run.result.trace["rank"] == 1)]
    topo = Topology(H800, par)
    dense, experts = (ch.params - ch.expert_params) * 2, ch.expert_params * 2
    # dense gradients over the 32 DP replicas (4 nodes x 8), expert gradients over the 2 GPUs holding
    # the same experts (16 apart: one on each of 2 nodes), both with NCCL's model
    dense_group, expert_group = topo.placement("dp", 1), topo.placement("expert_dp", 1)
    assert dense_group == Placement(32, 8, 4) and expert_group == Placement(2, 1, 2)
    expected = (estimate_group("all-reduce", dense, H800, dense_group).time_s
                + estimate_group("all-reduce", experts, H800, expert_group).time_s)
    assert len(dp) == 1 and (dp["end_s"] - dp["start_s"]).iloc[0] == pytest.approx(expected)
    assert dp["bytes"].iloc[0] == pytest.approx(dense + experts)


# --------------------------------------------------------------------------- lowering
def compute_rows(run, rank: int, mb: int, kind: str):
    t = run.result.trace
    return t[(t["rank"] == rank) & (t["category"] == "compute") & (t["microbatch"] == mb) & (t["kind"] == kind)]


def test_serial_sub_operations_follow_attention_dispatch_experts_combine():
    par = ParallelConfig(pp=2, dp=16, ep=16, microbatches=1)  # one microbatch: no p2p on the NIC meanwhile
    run = run_schedule("1f1b", tiny_moe(), H800, par)
    check_run(run, contiguous=False)
    trace = run.result.trace
    rows = compute_rows(run, 1, 0, "F").sort_values("start_s")
    assert rows["name"].tolist() == ["1F0 part 0", "experts 1F0 L2", "1F0 part 1", "experts 1F0 L3", "1F0 part 2"]
    for layer, (pre, experts, post) in zip((2, 3), ((0, 1, 2), (2, 3, 4))):
        d = trace[trace["name"].str.startswith(f"dispatch 1F0 L{layer} ")]
        c = trace[trace["name"].str.startswith(f"combine 1F0 L{layer} ")]
        assert (d["start_s"] == rows["end_s"].iloc[pre]).all()
        assert rows["start_s"].iloc[experts] == pytest.approx(d["end_s"].max())
        assert (c["start_s"] == rows["end_s"].iloc[experts]).all()
        assert rows["start_s"].iloc[post] == pytest.approx(c["end_s"].max())
    back = compute_rows(run, 1, 0, "B").sort_values("start_s")["name"].tolist()
    assert back == ["1B0 part 2", "experts 1B0 L3", "1B0 part 1", "experts 1B0 L2", "1B0 part 0"]
    assert trace["name"].str.startswith("combine-bwd 1B0 L3").sum() == 2  # NVLink and NIC parts
    rep = run.report
    assert rep.a2a_s > 0 and rep.exposed_a2a_s == pytest.approx(rep.a2a_s)  # nothing hides it
    assert rep.ep_share == pytest.approx(rep.exposed_a2a_s / rep.step_time_s)


def test_full_recomputation_replays_the_forward_all_to_all_in_backward():
    par = ParallelConfig(pp=2, dp=16, ep=16, microbatches=2, recompute="full")
    run = run_schedule("1f1b", tiny_moe(), H800, par)
    check_run(run, contiguous=False)
    names = run.result.trace["name"]
    assert names.str.startswith("dispatch 1B0 L3").sum() == 2 and names.str.startswith("combine 1B0 L3").sum() == 2


def test_waves_split_experts_and_bytes_and_shorten_the_step():
    model = tiny_moe(moe=dict(num_experts=64))  # 4 local experts with EP 16
    par = ParallelConfig(pp=2, dp=16, ep=16, microbatches=4, waves=4)
    serial = run_schedule("1f1b", model, H800, par)
    waved = run_schedule("1f1b+waved-ep", model, H800, par)
    check_run(waved, contiguous=False)
    assert waved.report.schedule == "1f1b+waved-ep"
    t = waved.result.trace
    experts = t[t["name"].str.startswith("experts 1F0 L2")]
    assert experts["name"].tolist() == [f"experts 1F0 L2 w{i}/4" for i in range(1, 5)]
    d = t[t["name"].str.startswith("dispatch 1F0 L2") & t["name"].str.endswith("nic")]
    assert d["bytes"].tolist() == [131072 / 4] * 4
    assert t.loc[t["kind"] == "a2a", "bytes"].sum() == pytest.approx(
        serial.result.trace.loc[serial.result.trace["kind"] == "a2a", "bytes"].sum())
    # this tiny model is latency-bound: each wave pays the link latency again, and waves lose
    assert waved.report.a2a_s > serial.report.a2a_s
    # with all-to-all comparable to compute, waves hide part of it and shorten the step
    model, par = balanced_moe(), ParallelConfig(pp=2, dp=8, ep=8, microbatches=4, waves=4)
    serial = run_schedule("1f1b", model, H800, par)
    waved = run_schedule("1f1b+waved-ep", model, H800, par)
    t = waved.result.trace
    assert waved.report.step_time_s < 0.95 * serial.report.step_time_s
    assert waved.report.exposed_a2a_s < 0.7 * serial.report.exposed_a2a_s
    # dispatch and combine share the ports: a rank's a2a transfers on one port never overlap (one
    # communicator's lane; a p2p send on the port shares it with them, simtrain.link_share)
    port = t[(t["kind"] == "a2a") & t["resources"].str.contains("nvlink:1:out")].sort_values("start_s")
    assert (port["start_s"].to_numpy()[1:] >= port["end_s"].to_numpy()[:-1] - 1e-15).all()
    separate = run_schedule("1f1b+waved-ep", model, H800, par.model_copy(update={"a2a_links": "separate"}))
    assert separate.report.step_time_s < waved.report.step_time_s
    assert separate.result.trace["resources"].str.contains("nvlink-combine:1:out").any()


def test_link_utilisation_is_busy_time_over_step_per_port_kind():
    par = ParallelConfig(pp=2, dp=16, ep=16, microbatches=2)
    run = run_schedule("1f1b", tiny_moe(), H800, par)
    util, t, step = run.report.link_utilisation, run.result.trace, run.report.step_time_s
    assert {"nic:out", "nic:in", "nvlink:out", "nvlink:in"} <= set(util)
    assert all(0 < v <= 1 for v in util.values())
    busy = sum((r.end_s - r.start_s) * sum(p.startswith("nic:") and p.endswith(":out") for p in r.resources.split(","))
               for r in t.itertuples())
    assert util["nic:out"] == pytest.approx(busy / (2 * step))


# --------------------------------------------------------------------------- F&B pairing (DualPipe)
@pytest.mark.parametrize("name", ["deepseek:DualPipeV", "deepseek:DualPipe"])
def test_fb_pairing_hides_all_to_all_behind_the_other_halfs_compute(name):
    model = balanced_moe(layers=9)
    par = ParallelConfig(pp=4, dp=8, ep=8, microbatches=8, zero_stage=1)
    sched = reference_schedule(name, 4, 8)
    paired, serial = run_schedule(sched, model, H800, par), run_schedule(unpaired(sched), model, H800, par)
    for run in (paired, serial):
        check_run(run, contiguous=False)
    assert paired.report.exposed_a2a_s < 0.8 * serial.report.exposed_a2a_s
    assert paired.report.step_time_s < serial.report.step_time_s
    waved = run_schedule(sched, model, H800, par, waved_ep=True)
    check_run(waved, contiguous=False)
    assert waved.report.exposed_a2a_s < serial.report.exposed_a2a_s
    # inside a pair the two halves' compute alternates on the stream, backward first
    pair = next(a for order in sched.orders for a in order if isinstance(a, OverlapAction))
    rank = sched.stage_to_rank[pair.forward.stage]
    t = paired.result.trace
    comp = t[(t["rank"] == rank) & (t["category"] == "compute")].sort_values("start_s")
    mine = comp[((comp["stage"] == pair.forward.stage) & (comp["microbatch"] == pair.forward.microbatch)
                 & (comp["kind"] == "F"))
                | ((comp["stage"] == pair.backward.stage) & (comp["microbatch"] == pair.backward.microbatch)
                   & (comp["kind"] == pair.backward.kind))]
    kinds = "".join(mine["kind"])
    assert kinds.startswith("BF") and "FB" in kinds[1:]


# --------------------------------------------------------------------------- forward only
def test_forward_only_runs_forwards_and_waves_still_overlap():
    model = balanced_moe()
    par = ParallelConfig(pp=2, dp=8, ep=8, microbatches=4, forward_only=True, waves=4)
    serial, waved = run_schedule("1f1b", model, H800, par), run_schedule("1f1b+waved-ep", model, H800, par)
    for run in (serial, waved):
        t = run.result.trace
        assert set(t.loc[t["category"] == "compute", "kind"]) == {"F"}
        assert not (t["kind"] == "dp").any() and not (t["kind"] == "OPT").any()
        assert run.report.peak_inflight_microbatches == [1, 1]
        mem = run.result.memory
        assert (mem.groupby("rank")["bytes"].last() == mem.groupby("rank")["bytes"].first()).all()
        assert 0 < run.report.mfu < 1
    assert waved.report.step_time_s < serial.report.step_time_s
    # F&B pairing cannot happen without backward: a DualPipeV order runs its forwards only
    sched = reference_schedule("deepseek:DualPipeV", 2, 4)
    fwd = run_schedule(sched, balanced_moe(layers=5), H800, par)
    assert set(fwd.result.trace.loc[fwd.result.trace["category"] == "compute", "kind"]) == {"F"}


# --------------------------------------------------------------------------- names and errors
def test_schedule_names_carry_variants():
    assert split_name("1f1b+waved-ep") == ("1f1b", ("waved-ep",))
    assert split_name("gpipe") == ("gpipe", ())
    # Waved-EP is a lowering option, not a schedule: the registry refuses the name, run_schedule
    # parses it at the edge, runs the plain order with waves and keeps the name in the report
    with pytest.raises(ScheduleError, match=r"'\+waved-ep' is how a schedule is run \(a lowering option\)"):
        generate("1f1b+waved-ep", 2, 4)
    with pytest.raises(ScheduleError, match=r"unknown variant '\+wavy'"):
        split_name("1f1b+wavy")
    with pytest.raises(ScheduleError, match="given twice"):
        split_name("1f1b+waved-ep+waved-ep")
    with pytest.raises(ScheduleError, match="unknown schedule 'zz'"):
        split_name("zz+waved-ep")


runner = CliRunner()


@pytest.fixture(scope="module")
def moe_yaml(tmp_path_factory):
    path = tmp_path_factory.mktemp("moe") / "tiny-moe.yaml"
    spec = balanced_moe().model_dump(exclude_none=True)
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def test_cli_json_rows_have_all_to_all_metrics(moe_yaml):
    res = runner.invoke(app, ["compare", "--model", moe_yaml, "--hardware", "h800", "--pp", "2", "--dp", "8",
                              "--ep", "8", "--microbatches", "4", "--schedules", "1f1b,1f1b+waved-ep",
                              "--waves", "2", "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert [r["schedule"] for r in rows] == ["1f1b", "1f1b+waved-ep"]
    for r in rows:
        assert r["a2a_s"] > 0 and 0 < r["exposed_a2a_s"] <= r["a2a_s"] + 1e-12
        assert r["ep_share"] == pytest.approx(r["exposed_a2a_s"] / r["step_time_s"])
        assert r["link_utilisation"]["nvlink:out"] > 0
    assert rows[1]["exposed_a2a_s"] < rows[0]["exposed_a2a_s"]


def test_cli_table_and_dashboard_show_all_to_all(moe_yaml, tmp_path):
    out = tmp_path / "moe.html"
    res = runner.invoke(app, ["compare", "--model", moe_yaml, "--hardware", "h800", "--pp", "2", "--dp", "16",
                              "--ep", "16", "--microbatches", "2", "--schedules", "1f1b+waved-ep",
                              "--forward-only", "--dispatch-dtype", "fp8", "--node-limit", "1", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "a2a (ms)" in res.stdout and "EP share" in res.stdout and "EP 16" in res.stdout
    assert "forward only" in res.stdout
    html = out.read_text()
    assert "exposed all-to-all (ms)" in html and "EP share" in html and "nic:out" in html


@pytest.mark.parametrize("args, message", [
    (["--model", "llama3-8b", "--pp", "2", "--dp", "2", "--ep", "2"],
     "--ep 2: model 'llama3-8b' is dense"),
    (["--model", "deepseek-v3", "--pp", "16", "--dp", "8", "--ep", "16"],
     "--ep 16: must divide dp x tp = 8 x 1 = 8"),
    (["--model", "mixtral-8x7b", "--pp", "4", "--dp", "16", "--ep", "16"],
     "--ep 16: must divide the 8 routed experts"),
    (["--model", "deepseek-v3", "--pp", "16", "--dp", "128", "--ep", "64", "--expert-imbalance", "65"],
     "--expert-imbalance 65.0: at most ep = 64"),
    (["--model", "deepseek-v3", "--pp", "16", "--dp", "128", "--ep", "64", "--zero-stage", "1",
      "--schedules", "1f1b+waved-ep", "--waves", "8"],
     "--waves 8: waves partition each rank's 4 local experts"),
    (["--model", "deepseek-v3", "--pp", "16", "--dp", "128", "--zero-stage", "1", "--schedules", "1f1b+waved-ep"],
     "+waved-ep: needs an MoE model with expert parallelism (ep > 1)"),
    (["--model", "deepseek-v3", "--pp", "16", "--schedules", "1f1b+wavy"],
     "--schedules: schedule '1f1b+wavy': unknown variant '+wavy'"),
    (["--model", "deepseek-v3", "--pp", "16", "--dispatch-dtype", "fp4"], "--dispatch-dtype = 'fp4'"),
    (["--model", "deepseek-v3", "--pp", "16", "--a2a-links", "both"], "--a2a-links = 'both'"),
    (["--model", "deepseek-v3", "--pp", "16", "--node-limit", "0"], "--node-limit = 0"),
    (["--model", "deepseek-v3", "--pp", "16", "--expert-imbalance", "0.5"], "--expert-imbalance = 0.5"),
])
def test_cli_rejects_bad_moe_settings_with_one_clear_error(args, message):
    res = runner.invoke(app, ["compare", "--hardware", "h800", "--json", *args])
    assert res.exit_code == 2, res.output
    assert message in res.output and "Traceback" not in res.output


def test_ep_groups_that_sit_differently_per_stage_are_refused():
    model = tiny_moe(moe=dict(num_experts=24))
    with pytest.raises(SimtrainError, match="sit differently on nodes of 8 GPUs"):
        stage_costs(model, ParallelConfig(pp=2, dp=12, ep=12), H800, 2)


def test_dense_models_are_unchanged_by_the_moe_code():
    par = ParallelConfig(pp=2, dp=2, microbatches=2)
    run = run_schedule("1f1b", tiny_moe().model_copy(update={"moe": None}), H800, par)
    assert run.report.a2a_s == 0 and run.report.ep_share == 0
    assert all(c.moe is None and c.expert_params == 0 for c in run.costs.chunks)
    # an MoE model without EP keeps its experts tensor-parallel and runs each action as one task
    moe_run = run_schedule("1f1b", tiny_moe(), H800, par)
    assert moe_run.report.a2a_s == 0 and not (moe_run.result.trace["kind"] == "a2a").any()
    assert Action(0, "F", 0) in {a for o in moe_run.schedule.orders for a in o}


# --------------------------------------------------------------------------- properties
@settings(max_examples=20, deadline=None)
@given(
    schedule=st.sampled_from(["gpipe", "1f1b", "deepseek:DualPipeV", "deepseek:DualPipe"]),
    m_mult=st.integers(1, 2),
    ep=st.sampled_from([4, 8, 16]),
    waves=st.sampled_from([1, 2, 4]),
    forward_only=st.booleans(),
    recompute=st.sampled_from(["selective", "full"]),
    links=st.sampled_from(["shared", "separate"]),
)
def test_any_moe_configuration_simulates_completely(schedule, m_mult, ep, waves, forward_only, recompute, links):
    model = tiny_moe(layers=8, moe=dict(num_experts=64))
    m = 4 * m_mult
    par = ParallelConfig(pp=2, dp=16, ep=ep, microbatches=m, waves=waves, forward_only=forward_only,
                         recompute=recompute, a2a_links=links, zero_stage=1,
                         ep_comm_sms=0)  # items add up to the chunk's seconds (the SM share: test_ep_sms)
    sched = reference_schedule(schedule, 2, m) if ":" in schedule else schedule
    run = run_schedule(sched, model, H800, par, waved_ep=waves > 1)
    trace = run.result.trace
    if forward_only:
        assert set(trace.loc[trace["category"] == "compute", "kind"]) == {"F"}
        mem = run.result.memory
        assert (mem.groupby("rank")["bytes"].last() - mem.groupby("rank")["bytes"].first()).abs().max() < 1e-3
    else:
        check_run(run, contiguous=False)
    # every MoE block moves its bytes once, whatever the waves: 2 all-to-alls per block in F, 2 in B
    # (+2 replayed under full recomputation)
    blocks = sum(len(run.costs.chunks[run.schedule.chunk_of(s)].moe.blocks) for s in range(run.schedule.num_stages)
                 if run.costs.chunks[run.schedule.chunk_of(s)].moe is not None)
    per_block = run.costs.chunks[-1].moe.blocks[0]
    one = per_block.dispatch.link_bytes("nvlink") + per_block.dispatch.link_bytes("nic")
    a2a_per_block = 2 if forward_only else (6 if recompute == "full" else 4)
    expected = blocks * m * a2a_per_block * one * (1 if schedule != "deepseek:DualPipe" else 0.5)
    assert trace.loc[trace["kind"] == "a2a", "bytes"].sum() == pytest.approx(expected)
    assert 0 <= run.report.exposed_a2a_s <= run.report.a2a_s + 1e-12
    # the sub-operations of every action add up to its chunk's F, B, I or W seconds
    comp = trace[(trace["category"] == "compute") & trace["stage"].notna()]
    busy = (comp["end_s"] - comp["start_s"]).groupby([comp["stage"], comp["microbatch"], comp["kind"]]).sum()
    for (stage, _, kind), seconds in busy.items():
        c = run.costs.chunks[run.schedule.chunk_of(int(stage))]
        cost = {"F": c.forward_s, "B": c.backward_s, "I": c.backward_input_s, "W": c.backward_weight_s}[kind]
        assert seconds == pytest.approx(cost, rel=1e-9)


def test_waved_ep_composes_with_the_registered_dualpipe_schedules(moe_yaml):
    res = runner.invoke(app, ["compare", "--model", moe_yaml, "--hardware", "h800", "--pp", "2", "--dp", "8",
                              "--ep", "8", "--microbatches", "8", "--zero-stage", "1", "--waves", "4", "--json",
                              "--schedules", "1f1b,1f1b+waved-ep,dualpipev,dualpipev+waved-ep,dualpipe,dualpipe+waved-ep"])
    assert res.exit_code == 0, res.output
    rows = {r["schedule"]: r for r in json.loads(res.stdout)}
    for base in ("1f1b", "dualpipev", "dualpipe"):
        assert rows[f"{base}+waved-ep"]["exposed_a2a_s"] < rows[base]["exposed_a2a_s"]
        assert rows[f"{base}+waved-ep"]["step_time_s"] < rows[base]["step_time_s"]
    for base in ("dualpipev", "dualpipe"):  # F&B pairs hide some all-to-all that 1F1B leaves exposed
        assert rows[base]["exposed_a2a_s"] / rows[base]["a2a_s"] < rows["1f1b"]["exposed_a2a_s"] / rows["1f1b"]["a2a_s"]


def test_moe_pairs_follow_the_profiles_pair_settings():
    model, par = balanced_moe(layers=9), ParallelConfig(pp=4, dp=8, ep=8, microbatches=8, zero_stage=1)
    slow = replace(H800, overlap_compute_factor=1.25, overlap_sends="per_half")
    plain, scaled = run_schedule("dualpipev", model, H800, par), run_schedule("dualpipev", model, slow, par)
    check_run(scaled, contiguous=False)
    pair = next(a for order in plain.schedule.orders for a in order if isinstance(a, OverlapAction))

    def busy(run, a):
        t = run.result.trace
        rows = t[(t["category"] == "compute") & (t["stage"] == a.stage) & (t["microbatch"] == a.microbatch)
                 & (t["kind"] == a.kind)]
        return (rows["end_s"] - rows["start_s"]).sum()

    for a in pair.parts:
        assert busy(scaled, a) == pytest.approx(1.25 * busy(plain, a))
    # after_pair (the default): a pair's sends leave when both halves are done
    t = plain.result.trace
    comp = t[t["category"] == "compute"]
    pair_end = max(comp.loc[(comp["stage"] == a.stage) & (comp["microbatch"] == a.microbatch)
                            & (comp["kind"] == a.kind), "end_s"].max() for a in pair.parts)
    sends = t[(t["kind"] == "p2p") & t["name"].str.startswith(tuple(f"p2p {p} " for p in pair.parts))]
    assert len(sends) and (sends["start_s"] >= pair_end - 1e-12).all()


def test_the_deepseek_v3_scenario_runs_with_expert_parallelism(rendered_scenarios):
    _, res = rendered_scenarios["deepseek-v3"]
    assert res.exit_code == 0, res.output
    rows = {r["schedule"]: r for r in json.loads(res.stdout)}
    row = rows["1f1b"]
    assert row["fits_in_hbm"] and row["a2a_s"] > 0 and row["exposed_a2a_s"] == pytest.approx(row["a2a_s"])
    assert row["link_utilisation"]["nic:out"] > row["link_utilisation"]["nvlink:out"] > 0
    # waves and F&B pairing each hide all-to-all time (DeepSeek-V4 §3.1; DeepSeek-V3 §3.2.1)
    assert rows["1f1b+waved-ep"]["exposed_a2a_s"] < row["exposed_a2a_s"]
    assert rows["dualpipe"]["exposed_a2a_s"] < row["exposed_a2a_s"]
    assert rows["dualpipe+waved-ep"]["exposed_a2a_s"] < rows["dualpipe"]["exposed_a2a_s"]
