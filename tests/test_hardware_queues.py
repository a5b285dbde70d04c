"""Hardware work queues (CUDA_DEVICE_MAX_CONNECTIONS, :mod:`simtrain.lowering.queues`): the
engine's dispatch-after edge against hand-computed traces (NVIDIA's simpleHyperQ sample among
them), the host launch order the lowering gives a hand-built step, and a lowered training step
under one queue."""

from __future__ import annotations

import dataclasses

import pytest

from simtrain.costs import StageCosts
from simtrain.engine import DeadlockError, TaskGraph, simulate
from simtrain.hardware import load_profile
from simtrain.lowering import lower
from simtrain.lowering.queues import issue_order
from simtrain.models import load_model
from simtrain.network import Topology
from simtrain.parallel import ParallelConfig
from simtrain.scenario import run_schedule
from simtrain.schedules.ir import Schedule, parse_action

from test_lowering_graph import _chunk

H100 = load_profile("h100-sxm")


def _spans(graph: TaskGraph) -> dict[str, tuple[float, float]]:
    trace = simulate(graph).trace
    return {row.name: (row.start_s, row.end_s) for row in trace.itertuples()}


def _hyperq(streams: int, kernel_s: float, queue: str) -> TaskGraph:
    """simpleHyperQ (NVIDIA/cuda-samples, Samples/0_Introduction/simpleHyperQ): kernel_A then
    kernel_B on each of ``streams`` streams, launched stream by stream. ``queue``: "one" (one
    hardware queue: each kernel dispatched after the one launched before it), "held" (the old
    upper bound: one resource held while a kernel runs) or "own" (a queue per stream)."""
    graph = TaskGraph(num_ranks=1)
    for i in range(streams):
        for k in "AB":
            previous = len(graph.tasks) - 1
            graph.add(name=f"{k}{i}", rank=0, category="compute", kind="F", duration_s=kernel_s, stream=f"s{i}",
                      dispatch_after=(previous,) if queue == "one" and previous >= 0 else (),
                      resources=("queue",) if queue == "held" else ())
    return graph


@pytest.mark.parametrize("streams", [1, 4, 32])
def test_one_queue_runs_simple_hyperq_in_the_samples_serial_time(streams):
    """The sample's "expected time for serial execution" without Hyper-Q is (nstreams + 1) x
    kernel_time at best: B_i and A_(i+1) run together, one A and one B at a time. Its Hyper-Q time
    is 2 x kernel_time; a queue held for the whole kernel would give 2 x nstreams x kernel_time."""
    t = 0.01
    one = _spans(_hyperq(streams, t, "one"))
    assert max(end for _, end in one.values()) == pytest.approx((streams + 1) * t)
    for i in range(streams):
        assert one[f"A{i}"] == pytest.approx((i * t, (i + 1) * t))
        assert one[f"B{i}"] == pytest.approx(((i + 1) * t, (i + 2) * t))
    assert max(end for _, end in _spans(_hyperq(streams, t, "own")).values()) == pytest.approx(2 * t)
    assert max(end for _, end in _spans(_hyperq(streams, t, "held")).values()) == pytest.approx(2 * streams * t)


def test_a_kernel_waiting_for_its_stream_holds_up_what_was_launched_behind_it():
    """dp: D1 (5 s) then D2 (1 s); compute C (1 s) launched after D2 on the same queue. D2 is
    dispatched when D1 ends, at 5 s, so C starts at 5 s although the compute stream is idle from 0
    (the head-of-line blocking seen in NVIDIA/Megatron-LM#636 and alibaba/Megatron-LLaMA#26)."""
    graph = TaskGraph(num_ranks=1)
    graph.add(name="D1", rank=0, category="comm", kind="dp", duration_s=5.0, stream="dp")
    graph.add(name="D2", rank=0, category="comm", kind="dp", duration_s=1.0, stream="dp")
    graph.add(name="C", rank=0, category="compute", kind="B", duration_s=1.0, stream="compute", dispatch_after=(1,))
    assert _spans(graph) == {"D1": (0.0, 5.0), "D2": (5.0, 6.0), "C": (5.0, 6.0)}


def test_dispatch_is_when_the_dependencies_are_met_not_when_the_ports_are_free():
    """A reduction D whose port a transfer X holds for 3 s is dispatched at 0 and starts at 3; the
    compute C launched behind it starts at 0: the queue only orders dispatch."""
    graph = TaskGraph(num_ranks=1)
    graph.add(name="X", rank=0, category="comm", kind="p2p", duration_s=3.0, resources=("nic",))
    graph.add(name="D", rank=0, category="comm", kind="dp", duration_s=1.0, stream="dp", resources=("nic",))
    graph.add(name="C", rank=0, category="compute", kind="B", duration_s=1.0, stream="compute", dispatch_after=(1,))
    assert _spans(graph) == {"X": (0.0, 3.0), "D": (3.0, 4.0), "C": (0.0, 1.0)}


def test_dispatch_waits_for_dependencies_of_every_kind():
    """C is dispatched after D, which waits for P's end (2 s): C starts at 2 s, not at 0."""
    graph = TaskGraph(num_ranks=1)
    graph.add(name="P", rank=0, category="compute", kind="B", duration_s=2.0, stream="compute")
    graph.add(name="D", rank=0, category="comm", kind="dp", duration_s=4.0, stream="dp", deps=[0])
    graph.add(name="C", rank=0, category="compute", kind="F", duration_s=1.0, stream="tp", dispatch_after=(1,))
    assert _spans(graph) == {"P": (0.0, 2.0), "D": (2.0, 6.0), "C": (2.0, 3.0)}


def test_a_dispatch_cycle_is_a_deadlock_and_a_bad_id_is_refused():
    graph = TaskGraph(num_ranks=1)
    graph.add(name="a", rank=0, category="compute", kind="F", duration_s=1.0, stream="compute", dispatch_after=(1,))
    graph.add(name="b", rank=0, category="compute", kind="F", duration_s=1.0, stream="tp", dispatch_after=(0,))
    with pytest.raises(DeadlockError, match="cannot run a: it waits for b"):
        simulate(graph)
    graph.tasks[1].dispatch_after = (1,)
    with pytest.raises(ValueError, match=r"task 1 \(b\): dispatch_after \(1,\)"):
        simulate(graph)


def _hand_step(queues: int | None):
    """tests/test_lowering_graph.py's hand-built step (2 stages, 1 microbatch, TP 2, DP 2, two
    gradient buckets), lowered with ``hardware_queues``."""
    hw = dataclasses.replace(H100, intra_node=dataclasses.replace(
        H100.intra_node, latency_s=0.0, efficiency=1.0, achieved_efficiency=1.0, nvls_efficiency=None,
        bandwidth_bytes_per_s=1.0, peer_bandwidth_bytes_per_s=1000.0))
    parallel = ParallelConfig(tp=2, pp=2, dp=2, dp_buckets=2, microbatches=1, hardware_queues=queues)
    schedule = Schedule("hand", 1, (0, 1), tuple(tuple(parse_action(a) for a in o.split())
                                                 for o in ("0F0 0B0", "1F0 1B0")))
    schedule.validate()
    costs = StageCosts(chunks=(_chunk(0), _chunk(1)), static_bytes_per_param=16.0, grad_bytes_per_param=2.0,
                       optimizer_s_per_param=0.1, tokens_per_microbatch=1)
    return lower(schedule, costs, Topology(hw, parallel))


def test_the_launch_order_puts_each_bucket_right_after_its_backward_piece():
    """Rank 0 launches F, its TP all-reduce, B's first piece, bucket 0's reduction (from the
    backward hook), B's second piece, bucket 1's, B's TP all-reduce, the optimizer step; under one
    queue each task is dispatched after the one before it unless that one is of its own stream."""
    graph = _hand_step(1)
    tasks = graph.tasks
    order = issue_order(tasks, 10)  # the hand step's chain tasks: ids 0-9 (F, TP, two B pieces, TP, per rank)
    names = {rank: [(tasks[t].name, tasks[t].stream) for t in ids] for rank, ids in order.items()}
    assert names[0] == [("0F0", "compute"), ("tp 0F0", "tp"), ("0B0", "compute"), ("dp grad stage 0 bucket 0", "dp"),
                        ("0B0", "compute"), ("dp grad stage 0 bucket 1", "dp"), ("tp 0B0", "tp"),
                        ("optimizer step", "compute")]
    for ids in order.values():
        assert tasks[ids[0]].dispatch_after == ()
        for before, tid in zip(ids, ids[1:]):
            want = () if tasks[before].stream == tasks[tid].stream else (before,)
            assert tasks[tid].dispatch_after == want
    starts = simulate(graph).source["start_s"]  # per task id
    for t in tasks:  # launch order = start order where the one launched before holds no port
        for before in t.dispatch_after:
            if not tasks[before].resources:
                assert starts[t.tid] >= starts[before]
    assert all(t.dispatch_after == () for t in _hand_step(None).tasks)
    assert all(t.dispatch_after == () for t in _hand_step(7).tasks)


def test_one_queue_lets_the_gradient_reduction_overlap_the_backward():
    """Llama 3 8B, PP 2, TP 2, DP 4: with one queue the DP buckets still run beside the backward
    (a compute task of the rank runs while one of its reductions runs), the step is no faster
    than with a queue per stream, and 7 queues (one per stream) change nothing."""
    model = load_model("llama3-8b")
    kw = dict(pp=2, tp=2, dp=4, microbatches=4, seq_len=2048)
    free, one, seven = (run_schedule("1f1b", model, H100, ParallelConfig(hardware_queues=q, **kw),
                                     op_times=(0.05, 0.05, 0.05)) for q in (None, 1, 7))
    assert seven.result.trace.equals(free.result.trace)
    trace = one.result.trace
    dp = trace[trace["kind"] == "dp"]
    compute = trace[trace["category"] == "compute"]
    overlapped = [(c.rank, c.name) for c in compute.itertuples() for d in dp.itertuples()
                  if c.rank == d.rank and c.start_s < d.end_s and d.start_s < c.end_s]
    assert overlapped
    assert one.report.step_time_s >= free.report.step_time_s - 1e-12
