"""Whole-step results pinned by hand in the cases balanced, dp = 1, tp = 1 runs never exercise:
dp > 1, tp > 1 with real communication, uneven ranks, and when memory changes."""

from __future__ import annotations

from collections import Counter

import pytest

from conftest import tiny_model
from simtrain.collectives import estimate
from simtrain.hardware import load_profile
from simtrain.parallel import ParallelConfig
from simtrain.scenario import run_schedule

H100 = load_profile("h100-sxm")
NVLINK = H100.intra_node


def _run(schedule: str, model=None, op_times=None, **par):
    return run_schedule(schedule, model or tiny_model(layers=4), H100, ParallelConfig(**par), op_times=op_times)


def _ring_rs(nbytes: float, n: int) -> float:
    """Reduce-scatter over n GPUs of one node, priced by NCCL's model (simtrain.collectives)."""
    return estimate("reduce-scatter", nbytes, H100, n).time_s


@pytest.fixture
def dp_run():
    """1F1B, pp 2, dp 2, tp 1, m 4, b 2, real costs and communication (all GPUs in one node).

    Function-scoped on purpose: mutmut credits code a cached fixture runs to the first test only."""
    return _run("1f1b", pp=2, dp=2, microbatches=4, microbatch_size=2)


def test_optimizer_waits_for_every_dp_reduction(dp_run):
    t = dp_run.result.trace
    for rank in (0, 1):
        dp = t[(t["rank"] == rank) & (t["kind"] == "dp")]
        opt = t[(t["rank"] == rank) & (t["kind"] == "OPT")]
        assert len(dp) == 4 and len(opt) == 1  # dp_buckets = 4
        # the last bucket is reduced after the last backward, so the step waits for it exactly
        assert opt["start_s"].iloc[0] == pytest.approx(dp["end_s"].max(), rel=1e-12)
        assert opt["start_s"].iloc[0] > t[(t["rank"] == rank) & (t["kind"] == "B")]["end_s"].max()


def test_dp_bucket_is_a_ring_all_reduce_written_out(dp_run):
    t = dp_run.result.trace
    for rank in (0, 1):
        params = dp_run.costs.chunks[rank].params
        for _, row in t[(t["rank"] == rank) & (t["kind"] == "dp")].iterrows():
            m = params * 2 / 4  # bf16 gradients, one of 4 buckets
            assert row["bytes"] == pytest.approx(m, rel=1e-12)
            # NCCL's all-reduce over n = dp = 2 GPUs (GPUs 0 and 2, same node: NVLink)
            expected = estimate("all-reduce", m, H100, 2).time_s
            assert row["end_s"] - row["start_s"] == pytest.approx(expected, rel=1e-9)


def test_zero1_parameter_all_gather_route_and_time_written_out():
    """ZeRO-1, pp 2, dp 4, tp 1: rank 1's DP group is GPUs 1, 3, 5, 7 (one node: NVLink)."""
    run = _run("1f1b", pp=2, dp=4, microbatches=4, zero_stage=1)
    t = run.result.trace
    gather = t[(t["rank"] == 1) & (t["name"] == "dp param all-gather")]
    m, n = run.costs.chunks[1].params * 2, 4  # bf16 parameters of the chunk
    assert gather["resources"].tolist() == ["nvlink:1:out,nvlink:1:in"]
    expected = estimate("all-gather", m, H100, n).time_s  # NCCL's model over the 4 GPUs of one node
    assert (gather["end_s"] - gather["start_s"]).tolist() == pytest.approx([expected], rel=1e-9)


def test_tokens_per_second_counts_every_replica(dp_run):
    r = dp_run.report
    assert r.tokens_per_s * r.step_time_s == pytest.approx(2 * 4 * 2 * 128, rel=1e-12)  # dp·m·b·s
    assert r.gpus == 4


def test_mfu_by_hand_end_to_end():
    model = tiny_model(layers=4, activation="gelu")  # h = 256, FFN 4h, V = 1000, s = 128
    dp, tp, pp, m, b = 2, 2, 2, 4, 2
    run = _run("1f1b", model=model, pp=pp, dp=dp, tp=tp, microbatches=m, microbatch_size=b)
    s, h, v, layers = 128, 256, 1000, 4
    # Narayanan et al. 2021 §5.1 (eq. 3): 72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h)) per replica-step
    flops = 72 * m * b * s * layers * h**2 * (1 + s / (6 * h) + v / (12 * layers * h))
    r = run.report
    assert r.model_flops == pytest.approx(dp * flops, rel=1e-12)
    assert r.mfu == pytest.approx(flops / (r.step_time_s * tp * pp * H100.peak_flops["bf16"]), rel=1e-12)


def test_forward_only_mfu_by_hand():
    model = tiny_model(layers=4, activation="gelu")
    dp, pp, m, b, s, h, v, layers = 2, 2, 4, 2, 128, 256, 1000, 4
    run = _run("1f1b", model=model, pp=pp, dp=dp, microbatches=m, microbatch_size=b, forward_only=True)
    # the forward third of Narayanan et al. 2021 eq. (3): per token L(24h² + 4sh) + 2hV
    flops = m * b * s * (layers * (24 * h**2 + 4 * s * h) + 2 * h * v)
    r = run.report
    assert r.model_flops == pytest.approx(dp * flops, rel=1e-12)
    assert r.mfu == pytest.approx(flops / (r.step_time_s * pp * H100.peak_flops["bf16"]), rel=1e-12)


def test_bubble_ratio_is_the_mean_over_uneven_ranks():
    run = _run("1f1b", pp=4, microbatches=8)  # real costs: the last stage holds the LM head
    r, t = run.report, run.result.trace
    comp = t[t["category"] == "compute"]
    busy = [(g["end_s"] - g["start_s"]).sum() for _, g in comp.groupby("rank")]
    per_rank = [1 - b / r.step_time_s for b in busy]  # all idle time: the idle ratio
    assert r.idle_ratio_per_rank == pytest.approx(per_rank, rel=1e-9)
    assert max(busy) - min(busy) > 0.05 * max(busy)  # really uneven
    assert r.idle_ratio == pytest.approx(sum(per_rank) / 4, rel=1e-12)
    # the pipeline bubble (idle with none of the rank's communication in flight) aggregates the same way
    assert r.bubble_ratio == pytest.approx(sum(r.bubble_ratio_per_rank) / 4, rel=1e-12)
    assert all(b <= i + 1e-12 for b, i in zip(r.bubble_ratio_per_rank, r.idle_ratio_per_rank))


def test_exposed_comm_of_gpipe_pp2_m1_by_hand():
    model = tiny_model(layers=4)
    run = run_schedule("gpipe", model, H100, ParallelConfig(pp=2, microbatches=1), op_times=(1.0, 1.0, 1.0))
    # F = I = W = 1 s (B = 2 s); the 128·256 bf16 activation crosses NVLink each way in T seconds:
    T = NVLINK.latency_s + 128 * 256 * 2 / (NVLINK.peer_bandwidth_bytes_per_s * NVLINK.collective_efficiency)  # noqa: N806
    # rank 0: F [0,1], send; rank 1: F [1+T, 2+T], B [2+T, 4+T], send back; rank 0: B [4+2T, 6+2T]
    r = run.report
    assert r.step_time_s == pytest.approx(6 + 2 * T, rel=1e-12)
    # each rank waits idle for both transfers: the one it sends and the one it receives
    assert r.exposed_comm_s_per_rank == pytest.approx([2 * T, 2 * T], rel=1e-9)
    assert r.comm_s == pytest.approx(4 * T, rel=1e-9) and r.overlap_ratio == pytest.approx(0.0, abs=1e-12)
    assert r.idle_ratio_per_rank == pytest.approx([1 - 3 / (6 + 2 * T)] * 2, rel=1e-12)
    # the pipeline bubble leaves out the 2T each rank waits on a transfer: (6 + 2T - 3 - 2T) / step
    assert r.bubble_ratio_per_rank == pytest.approx([3 / (6 + 2 * T)] * 2, rel=1e-9)


@pytest.mark.parametrize("schedule", ["zb-h1", "zbv"])
def test_every_f_and_i_carries_its_tp_collective(schedule):
    model = tiny_model(layers=4)
    tp, b = 2, 1
    run = _run(schedule, model=model, pp=2, tp=tp, microbatches=4, microbatch_size=b)
    t = run.result.trace
    per_layer = 4 * _ring_rs(128 * b * 256 * 2, tp)  # 2 AG + 2 RS of the s·b·h tensor per layer (SP)
    layers = {c.chunk: len(c.layers) for c in run.costs.chunks}
    comp = t[t["kind"].isin(["F", "I", "W"])]
    tps = t[t["kind"] == "tp"]
    assert len(tps) == len(comp[comp["kind"] != "W"]) == 2 * 4 * run.schedule.num_stages
    got = Counter((int(r.stage), int(r.microbatch)) for r in tps.itertuples())
    for row in comp.itertuples():
        mine = tps[tps["name"] == f"tp {row.name}"]
        if row.kind == "W":
            assert mine.empty
            continue
        assert len(mine) == 1 and mine["rank"].iloc[0] == row.rank
        assert mine["resources"].iloc[0] == f"nvlink:{row.rank}:out,nvlink:{row.rank}:in"  # a node's TP group
        assert mine["start_s"].iloc[0] >= row.end_s - 1e-15
        n = layers[run.schedule.chunk_of(int(row.stage))]
        assert mine["end_s"].iloc[0] - mine["start_s"].iloc[0] == pytest.approx(n * per_layer, rel=1e-9)
    assert set(got.values()) == {2}  # one for F, one for I


def test_full_recompute_replays_forward_tp_collectives_in_b():
    tp, b = 2, 1
    per_layer = 4 * _ring_rs(128 * b * 256 * 2, tp)
    for recompute, factor in (("selective", 1), ("full", 2)):
        run = _run("1f1b", pp=2, tp=tp, microbatches=2, microbatch_size=b, recompute=recompute)
        t = run.result.trace
        tps = t[t["kind"] == "tp"]
        for kind, mult in (("F", 1), ("B", factor)):
            rows = tps[tps["name"].str.match(rf"tp \d+{kind}\d+")]
            assert len(rows) == 4
            assert (rows["end_s"] - rows["start_s"]).tolist() == pytest.approx([2 * per_layer * mult] * 4, rel=1e-9)


@pytest.mark.parametrize("schedule", ["1f1b", "zb-h1"])
def test_memory_changes_when_its_task_starts_or_ends(schedule):
    """F allocates its activation at its start; B frees it at its end; I keeps what W needs until
    W ends (Korthikanti-sized chunks, real costs)."""
    run = _run(schedule, pp=2, dp=2, microbatches=4)
    t, mem = run.result.trace, run.result.memory
    chunk = {c.chunk: c for c in run.costs.chunks}
    acts = t[t["kind"].isin(["F", "B", "I", "W"])].groupby(["rank", "stage", "microbatch", "kind"])
    start, end = acts["start_s"].min(), acts["end_s"].max()
    expected = Counter()
    for key, s0 in start.items():
        rank, stage, _, kind = key
        c, e0 = chunk[run.schedule.chunk_of(int(stage))], end[key]
        delta = {"F": (s0, c.activation_bytes), "B": (e0, -c.activation_bytes),
                 "I": (e0, c.weight_grad_bytes - c.activation_bytes), "W": (e0, -c.weight_grad_bytes)}[kind]
        expected[(int(rank), delta[0], round(delta[1]))] += 1
    seen = Counter()
    for rank, rows in mem.groupby("rank"):
        rows = rows.reset_index(drop=True)
        assert rows["time_s"].iloc[0] == 0 and rows["time_s"].is_monotonic_increasing
        for i in range(1, len(rows)):
            seen[(int(rank), rows["time_s"].iloc[i], round(rows["bytes"].iloc[i] - rows["bytes"].iloc[i - 1]))] += 1
    assert seen == expected


@pytest.mark.parametrize("profile, tp, link", [("mi300x", 1, "nvlink"), ("h100-sxm", 8, "nic")])
def test_p2p_holds_sender_out_and_receiver_in_at_the_per_peer_bandwidth(profile, tp, link):
    """MI300X's mesh gives one peer less than the GPU's total bandwidth; with tp 8 the two stages sit
    on two H100 nodes and a message gets the GPU's share of the node's NICs."""
    hw = load_profile(profile)
    model = tiny_model(layers=4, num_heads=8)
    run = run_schedule("gpipe", model, hw, ParallelConfig(pp=2, tp=tp, microbatches=1), op_times=(1.0, 1.0, 1.0))
    p2p = run.result.trace[run.result.trace["kind"] == "p2p"]
    if link == "nvlink":
        ln, bw = hw.intra_node, hw.intra_node.peer_bandwidth_bytes_per_s
        assert bw < hw.intra_node.bandwidth_bytes_per_s
    else:
        ln = hw.inter_node
        bw = ln.bandwidth_bytes_per_s * ln.nics_per_node / hw.gpus_per_node
    nbytes = 128 * 256 * 2 / tp  # s·b·h bf16, sharded by sequence parallelism
    assert p2p["resources"].tolist() == [f"{link}:0:out,{link}:1:in", f"{link}:1:out,{link}:0:in"]
    assert (p2p["end_s"] - p2p["start_s"]).tolist() == pytest.approx(
        [ln.latency_s + nbytes / (bw * ln.collective_efficiency)] * 2, rel=1e-12)
