"""ZeRO-1's parameter all-gather overlapped with the next step's forwards (``overlap_param_gather``;
Megatron-Core ``overlap_param_gather``, Apex ``overlap_param_sync``): on a hand-built one-rank
schedule of two chunks, the all-gathers start with the step, each chunk's first forward waits for
its own chunk, and the optimizer step ends the step without an all-gather. Expected step times are
written out from the task durations."""

from __future__ import annotations

import dataclasses

import pytest

from simtrain.costs import ChunkCost, StageCosts
from simtrain.engine import simulate
from simtrain.hardware import load_profile
from simtrain.lowering import lower
from simtrain.network import Collective, Topology
from simtrain.parallel import ParallelConfig
from simtrain.schedules.ir import Schedule, parse_action

# intra-node links of 1 B/s, no latency beyond NCCL's own, no NVLS: an all-gather of M bytes over the
# 2 DP ranks moves (n-1)/n M = M/2 bytes per GPU, M/2 seconds
HW = load_profile("h100-sxm")
HW = dataclasses.replace(HW, intra_node=dataclasses.replace(
    HW.intra_node, latency_s=0.0, efficiency=1.0, achieved_efficiency=1.0, nvls_efficiency=None,
    bandwidth_bytes_per_s=1.0, peer_bandwidth_bytes_per_s=1000.0))
OPT_S_PER_PARAM = 0.01


def _chunk(c: int, forward_s: float, params: float) -> ChunkCost:
    return ChunkCost(
        chunk=c, layers=(c,), has_embedding=c == 0, has_head=c == 1, forward_s=forward_s, backward_input_s=2.0,
        backward_weight_s=0.0, forward_flops=0.0, backward_input_flops=0.0, backward_weight_flops=0.0,
        activation_bytes=100.0, weight_grad_bytes=0.0, p2p_bytes=1000.0, params=params,
    )


def _step(overlap: bool, first_forward_s: float):
    """One rank holding chunks 0 and 1 (an interleaved layout, vp 2), one microbatch, DP 2, ZeRO-1:
    chunk 0 has 4 parameters (8 bytes, a 4 s all-gather), chunk 1 has 6 (12 bytes, 6 s)."""
    parallel = ParallelConfig(pp=1, vp=2, dp=2, dp_buckets=1, microbatches=1, zero_stage=1, nccl_channels=0,
                              overlap_param_gather=overlap)
    schedule = Schedule("hand", 1, (0, 0), (tuple(parse_action(a) for a in "0F0 1F0 1B0 0B0".split()),))
    schedule.validate()
    costs = StageCosts(chunks=(_chunk(0, first_forward_s, 4.0), _chunk(1, 1.0, 6.0)), static_bytes_per_param=16.0,
                       grad_bytes_per_param=2.0, optimizer_s_per_param=OPT_S_PER_PARAM, tokens_per_microbatch=1)
    topology = Topology(HW, parallel)
    graph = lower(schedule, costs, topology)
    gather = [topology.seconds(Collective("all-gather", "dp", 2.0 * p), 0) for p in (4.0, 6.0)]
    reduce = [topology.seconds(Collective("reduce-scatter", "dp", 2.0 * p), 0) for p in (4.0, 6.0)]
    return graph, simulate(graph), gather, reduce


def _tasks(graph, run):
    start, end = run.source["start_s"], run.source["end_s"]  # in task order
    return {t.name: (start[t.tid], end[t.tid], t) for t in graph.tasks}


def test_the_gathers_are_priced_as_all_gathers_of_each_chunk():
    _, _, gather, reduce = _step(True, 1.0)
    assert gather == pytest.approx([4.0, 6.0], abs=1e-4)  # M/2 seconds, plus NCCL's few-microsecond latency
    assert reduce == pytest.approx([4.0, 6.0], abs=1e-4)


@pytest.mark.parametrize("first_forward_s", [10.0, 1.0])
def test_without_overlap_the_whole_gather_ends_the_step(first_forward_s):
    """0F0, 1F0, 1B0 (2 s), then chunk 1's reduce-scatter runs beside 0B0 (2 s); chunk 0's after it;
    the optimizer (10 params x 0.01 s) and the all-gather of both chunks (one collective) close the step."""
    graph, run, _, reduce = _step(False, first_forward_s)
    tasks = _tasks(graph, run)
    end_of_backwards = first_forward_s + 1.0 + 2.0 + 2.0
    reductions_done = max(end_of_backwards, first_forward_s + 1.0 + 2.0 + reduce[1]) + reduce[0]
    all_gather = tasks["dp param all-gather"]
    assert all_gather[0] == pytest.approx(reductions_done + 10 * OPT_S_PER_PARAM)
    gather_s = all_gather[1] - all_gather[0]
    assert gather_s == pytest.approx(10.0, abs=1e-4)  # 20 bytes / 2
    assert run.makespan_s == pytest.approx(reductions_done + 10 * OPT_S_PER_PARAM + gather_s)
    assert all_gather[2].stream == "dp"
    assert not any(t.kind == "zero" for t in graph.tasks)


def test_a_long_first_forward_hides_the_next_chunks_gather():
    """Chunk 0's gather (4 s) is exposed before 0F0; chunk 1's (6 s) runs during 0F0 (10 s) and is
    hidden: 1F0 starts when 0F0 ends. The step loses its closing all-gather (10 s) and gains 4 s."""
    graph, run, gather, reduce = _step(True, 10.0)
    tasks = _tasks(graph, run)
    g0, g1 = tasks["zero param all-gather chunk 0"], tasks["zero param all-gather chunk 1"]
    assert (g0[0], g0[1]) == pytest.approx((0.0, gather[0]))
    assert (g1[0], g1[1]) == pytest.approx((gather[0], gather[0] + gather[1]))  # FIFO on the zero stream
    assert {g0[2].stream, g1[2].stream} == {"zero"}
    assert tasks["0F0"][0] == pytest.approx(gather[0])
    assert tasks["1F0"][0] == pytest.approx(gather[0] + 10.0)  # the forward, not the gather, decides
    assert "dp param all-gather" not in tasks
    end_of_backwards = gather[0] + 10.0 + 1.0 + 2.0 + 2.0
    reductions_done = max(end_of_backwards, gather[0] + 13.0 + reduce[1]) + reduce[0]
    assert run.makespan_s == pytest.approx(reductions_done + 10 * OPT_S_PER_PARAM)
    _, off, _, _ = _step(False, 10.0)
    assert run.makespan_s - off.makespan_s == pytest.approx(gather[0] - 10.0, abs=1e-4)  # +4 s - 10 s


def test_a_short_first_forward_leaves_the_next_chunks_gather_exposed():
    """With 0F0 at 1 s, 1F0 waits for chunk 1's gather: it starts at 4 + 6 = 10 s, not at 5 s. The
    step is 10 s (the closing gather) shorter and 4 + 6 - 1 s longer at its start: 1 s gained."""
    graph, run, gather, reduce = _step(True, 1.0)
    tasks = _tasks(graph, run)
    assert tasks["0F0"][0] == pytest.approx(gather[0])
    assert tasks["1F0"][0] == pytest.approx(gather[0] + gather[1])
    end_of_backwards = gather[0] + gather[1] + 1.0 + 2.0 + 2.0
    reductions_done = max(end_of_backwards, gather[0] + gather[1] + 3.0 + reduce[1]) + reduce[0]
    assert run.makespan_s == pytest.approx(reductions_done + 10 * OPT_S_PER_PARAM)
    _, off, _, _ = _step(False, 1.0)
    assert run.makespan_s - off.makespan_s == pytest.approx(-1.0, abs=1e-4)


def test_overlap_param_gather_needs_a_sharded_optimizer():
    with pytest.raises(ValueError, match="overlap_param_gather with zero_stage 0"):
        ParallelConfig(dp=2, zero_stage=0, overlap_param_gather=True)
    assert ParallelConfig(dp=2, zero_stage=2, overlap_param_gather=True).overlap_param_gather


def test_a_third_chunk_is_gathered_when_the_second_chunks_first_forward_begins():
    """One chunk ahead (Megatron's dispatch on pipeline rank 0): chunks 0 and 1 at the step's
    start, chunk 2 when the rank begins chunk 1's first forward. Chunks of 4, 6 and 2 parameters (4, 6, 1 s
    gathers), 0F0 10 s: gather 0 0-4, 0F0 4-14, gather 1 4-10, 1F0 14-15, gather 2 from 14 (not
    from 10, when the zero stream is free) to 15, so 2F0 starts at 15 + 0 s."""
    parallel = ParallelConfig(pp=1, vp=3, dp=2, dp_buckets=1, microbatches=1, zero_stage=1, nccl_channels=0,
                              overlap_param_gather=True)
    order = "0F0 1F0 2F0 2B0 1B0 0B0"
    schedule = Schedule("hand", 1, (0, 0, 0), (tuple(parse_action(a) for a in order.split()),))
    schedule.validate()
    chunks = (_chunk(0, 10.0, 4.0), _chunk(1, 1.0, 6.0), dataclasses.replace(_chunk(2, 1.0, 2.0), has_head=True))
    costs = StageCosts(chunks=chunks, static_bytes_per_param=16.0, grad_bytes_per_param=2.0,
                       optimizer_s_per_param=OPT_S_PER_PARAM, tokens_per_microbatch=1)
    topology = Topology(HW, parallel)
    graph = lower(schedule, costs, topology)
    tasks = _tasks(graph, simulate(graph))
    gather = [topology.seconds(Collective("all-gather", "dp", 2.0 * p), 0) for p in (4.0, 6.0, 2.0)]
    g2 = tasks["zero param all-gather chunk 2"]
    assert tasks["1F0"][0] == pytest.approx(gather[0] + 10.0)
    assert g2[0] == pytest.approx(tasks["1F0"][0])  # issued as chunk 1's first forward begins
    assert g2[1] == pytest.approx(gather[0] + 10.0 + gather[2])
    assert tasks["2F0"][0] == pytest.approx(max(tasks["1F0"][1], g2[1]))
