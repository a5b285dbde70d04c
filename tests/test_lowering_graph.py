"""A hand-built Schedule + StageCosts lowers to an exact task graph: tasks, streams, durations,
dependencies, bytes, ports and memory deltas, written out by hand."""

from __future__ import annotations

import dataclasses

import pytest

from simtrain.costs import ChunkCost, StageCosts
from simtrain.hardware import load_profile
from simtrain.lowering import lower
from simtrain.network import Collective, Topology
from simtrain.parallel import ParallelConfig
from simtrain.schedules.ir import Schedule, parse_action


NCCL_LAT_S = (8.4 + 2 * 3.4) * 1e-6  # ring/Simple over 2 ranks: base + 2(n-1) hops (simtrain.collectives)


def _chunk(c: int) -> ChunkCost:
    return ChunkCost(
        chunk=c, layers=(c,), has_embedding=c == 0, has_head=c == 1, forward_s=1.0, backward_input_s=2.0,
        backward_weight_s=0.5, forward_flops=0.0, backward_input_flops=0.0, backward_weight_flops=0.0,
        activation_bytes=100.0, weight_grad_bytes=30.0, p2p_bytes=1000.0, params=10.0,
        tp_forward=(Collective("all-reduce", "tp", 4.0),), tp_backward=(Collective("all-reduce", "tp", 8.0),),
    )


def _graph(optimizer_s_per_param: float = 0.0):
    # links of 1 B/s (peer: 1000 B/s), no latency, no NVLS: a ring all-reduce of M bytes over 2 GPUs
    # takes 2 x 1/2 x M = M seconds plus NCCL's ring/Simple latency (NCCL_LAT_S), a p2p of 1000 bytes 1 s
    hw = load_profile("h100-sxm")
    hw = dataclasses.replace(hw, intra_node=dataclasses.replace(
        hw.intra_node, latency_s=0.0, efficiency=1.0, achieved_efficiency=1.0, nvls_efficiency=None,
        bandwidth_bytes_per_s=1.0, peer_bandwidth_bytes_per_s=1000.0))
    parallel = ParallelConfig(tp=2, pp=2, dp=2, dp_buckets=2, microbatches=1)
    schedule = Schedule("hand", 1, (0, 1), tuple(tuple(parse_action(a) for a in o.split())
                                                 for o in ("0F0 0B0", "1F0 1B0")))
    schedule.validate()
    costs = StageCosts(chunks=(_chunk(0), _chunk(1)), static_bytes_per_param=16.0, grad_bytes_per_param=2.0,
                       optimizer_s_per_param=optimizer_s_per_param, tokens_per_microbatch=1)
    return lower(schedule, costs, Topology(hw, parallel))


def test_a_hand_built_schedule_lowers_to_the_exact_graph():
    graph = _graph()
    assert graph.static_memory_bytes == [160.0, 160.0]
    nv0, nv1 = ("nvlink:0:out", "nvlink:0:in"), ("nvlink:1:out", "nvlink:1:in")
    # (name, rank, stream, duration_s, deps, nbytes, resources, mem_start, mem_end), in creation order;
    # a TP task carries its all-reduce's buffer bytes (4 forward, 8 backward)
    expected = [
        ("0F0", 0, "compute", 1.0, [], 0.0, (), [(0, 100.0)], []),  # 0
        ("tp 0F0", 0, "tp", 4.0 + NCCL_LAT_S, [0], 4.0, nv0, [], []),  # 1
        ("0B0", 0, "compute", 1.25, [1, 1, 10], 0.0, (), [], []),  # 2: B cut into 2 DP buckets
        ("0B0", 0, "compute", 1.25, [2], 0.0, (), [], [(0, -100.0)]),  # 3
        ("tp 0B0", 0, "tp", 8.0 + NCCL_LAT_S, [3], 8.0, nv0, [], []),  # 4
        ("1F0", 1, "compute", 1.0, [11], 0.0, (), [(1, 100.0)], []),  # 5
        ("tp 1F0", 1, "tp", 4.0 + NCCL_LAT_S, [5], 4.0, nv1, [], []),  # 6
        ("1B0", 1, "compute", 1.25, [6, 6], 0.0, (), [], []),  # 7
        ("1B0", 1, "compute", 1.25, [7], 0.0, (), [], [(1, -100.0)]),  # 8
        ("tp 1B0", 1, "tp", 8.0 + NCCL_LAT_S, [8], 8.0, nv1, [], []),  # 9
        ("p2p 1B0 -> 0B0", 1, None, 1.0, [9], 1000.0, ("nvlink:1:out", "nvlink:0:in"), [], []),  # 10
        ("p2p 0F0 -> 1F0", 0, None, 1.0, [1], 1000.0, ("nvlink:0:out", "nvlink:1:in"), [], []),  # 11
        # gradient buckets: 10 params x 2 bytes / 2 buckets = 10 bytes, all-reduced over 2 replicas
        ("dp grad stage 0 bucket 0", 0, "dp", 10.0 + NCCL_LAT_S, [2], 10.0, nv0, [], []),
        ("dp grad stage 0 bucket 1", 0, "dp", 10.0 + NCCL_LAT_S, [3], 10.0, nv0, [], []),
        ("dp grad stage 1 bucket 0", 1, "dp", 10.0 + NCCL_LAT_S, [7], 10.0, nv1, [], []),
        ("dp grad stage 1 bucket 1", 1, "dp", 10.0 + NCCL_LAT_S, [8], 10.0, nv1, [], []),
    ]
    got = [(t.name, t.rank, t.stream, t.duration_s, t.deps, t.nbytes, tuple(t.resources), t.mem_start, t.mem_end)
           for t in graph.tasks]
    assert [g[3] for g in got] == pytest.approx([e[3] for e in expected], rel=1e-12)
    assert [g[:3] + g[4:] for g in got] == [e[:3] + e[4:] for e in expected]


def test_the_optimizer_step_waits_for_the_last_backwards_tp_collective():
    """The last backward's TP all-reduce carries the input gradient (Megatron issues it on the
    compute stream before the optimizer's kernels): the step depends on it, its compute and its
    gradient buckets, not on the compute alone."""
    graph = _graph(optimizer_s_per_param=0.1)
    tid = {(t.name, t.rank): t.tid for t in graph.tasks}
    for rank in (0, 1):
        opt = next(t for t in graph.tasks if t.name == "optimizer step" and t.rank == rank)
        assert opt.duration_s == pytest.approx(1.0)  # 10 parameters x 0.1 s
        last_compute = max(t.tid for t in graph.tasks if t.name == f"{rank}B0")  # B's 2nd bucket slice
        assert set(opt.deps) == {last_compute, tid[f"tp {rank}B0", rank],
                                 tid[f"dp grad stage {rank} bucket 0", rank], tid[f"dp grad stage {rank} bucket 1", rank]}


def test_memory_returns_to_static_and_every_action_is_lowered_once():
    graph = _graph()
    for rank in (0, 1):
        deltas = [d for t in graph.tasks for d in t.mem_start + t.mem_end if d[0] == rank]
        assert sum(b for _, b in deltas) == 0.0
    compute = sorted({t.name for t in graph.tasks if t.stream == "compute"})
    assert compute == ["0B0", "0F0", "1B0", "1F0"]


def test_action_kinds_keep_the_torch_text_form():
    from simtrain.schedules import ActionKind

    a = parse_action("2I3")
    assert a.kind == ActionKind.BACKWARD_INPUT and str(a) == "2I3"
    assert [k.value for k in ActionKind] == ["F", "B", "I", "W"]
