"""The engine on hand-made graphs with hand-computed times, contention, memory and deadlocks."""

from __future__ import annotations

import pytest

from conftest import tiny_model
from simtrain.engine import DeadlockError, TaskGraph, simulate
from simtrain.hardware import load_profile
from simtrain.network import Topology
from simtrain.parallel import ParallelConfig
from simtrain.scenario import run_schedule


def _two_rank_graph(transfer_s: float) -> TaskGraph:
    g = TaskGraph(num_ranks=2, static_memory_bytes=[10.0, 20.0])
    a = g.add(name="A", rank=0, category="compute", kind="F", duration_s=2.0, stream="compute",
              mem_start=[(0, 5.0)], mem_end=[(0, -5.0)])
    t = g.add(name="T", rank=0, peer=1, category="comm", kind="p2p", duration_s=transfer_s,
              deps=[a.tid], resources=("link:0:out", "link:1:in"), nbytes=1e6)
    g.add(name="B", rank=1, category="compute", kind="F", duration_s=1.0, deps=[t.tid], stream="compute")
    return g


def test_one_transfer_exact_times():
    res = simulate(_two_rank_graph(3.0))
    rows = res.trace.set_index("name")
    assert (rows.loc["A", "start_s"], rows.loc["A", "end_s"]) == (0.0, 2.0)
    assert (rows.loc["T", "start_s"], rows.loc["T", "end_s"]) == (2.0, 5.0)
    assert (rows.loc["B", "start_s"], rows.loc["B", "end_s"]) == (5.0, 6.0)
    assert res.makespan_s == 6.0
    mem0 = res.memory[res.memory["rank"] == 0]["bytes"].tolist()
    assert mem0 == [10.0, 15.0, 10.0]


def test_two_transfers_contend_on_one_link():
    g = TaskGraph(num_ranks=3)
    g.add(name="T1", rank=0, peer=1, category="comm", kind="p2p", duration_s=2.0, resources=("link:0:out", "link:1:in"))
    g.add(name="T2", rank=0, peer=2, category="comm", kind="p2p", duration_s=3.0, resources=("link:0:out", "link:2:in"))
    g.add(name="T3", rank=2, peer=1, category="comm", kind="p2p", duration_s=1.0, resources=("link:2:out", "link:1:in"))
    rows = simulate(g).trace.set_index("name")
    assert rows.loc["T1", "end_s"] == 2.0  # first on port 0:out
    assert (rows.loc["T2", "start_s"], rows.loc["T2", "end_s"]) == (2.0, 5.0)  # waits for 0:out
    assert (rows.loc["T3", "start_s"], rows.loc["T3", "end_s"]) == (2.0, 3.0)  # waits for 1:in


def test_a_release_serves_the_oldest_waiting_request_first_whatever_it_wants():
    """H holds ports a and b; X (wants a), Y (a and b, what H holds) and Z (b) queue in that
    order. When H ends X and Z, the older requests, take a and b; Y waits for both. Requests
    of H's own kind (Y2) then follow Y one after the other."""
    g = TaskGraph(num_ranks=1)
    for name, ports in (("H", ("a", "b")), ("X", ("a",)), ("Y", ("a", "b")), ("Z", ("b",)), ("Y2", ("a", "b"))):
        g.add(name=name, rank=0, category="comm", kind="p2p", duration_s=1.0, resources=ports)
    rows = simulate(g).trace.set_index("name")
    assert {n: (rows.loc[n, "start_s"], rows.loc[n, "end_s"]) for n in ("H", "X", "Y", "Z", "Y2")} == {
        "H": (0.0, 1.0), "X": (1.0, 2.0), "Z": (1.0, 2.0), "Y": (2.0, 3.0), "Y2": (3.0, 4.0)}


def test_streams_run_in_order_and_free_tasks_in_parallel():
    g = TaskGraph(num_ranks=1)
    g.add(name="X", rank=0, category="compute", kind="F", duration_s=1.0, stream="compute")
    g.add(name="Y", rank=0, category="compute", kind="F", duration_s=1.0, stream="compute")
    g.add(name="Z", rank=0, category="comm", kind="p2p", duration_s=1.5)
    rows = simulate(g).trace.set_index("name")
    assert rows.loc["Y", "start_s"] == 1.0 and rows.loc["Z", "start_s"] == 0.0


def test_deadlock_is_reported_with_ranks_and_tasks():
    g = TaskGraph(num_ranks=2)
    g.add(name="1B0", rank=0, category="compute", kind="B", duration_s=1.0, stream="compute", deps=[1])
    g.add(name="2B0", rank=1, category="compute", kind="B", duration_s=1.0, stream="compute", deps=[0])
    with pytest.raises(DeadlockError, match=r"rank 0 \(compute\) cannot run 1B0: it waits for 2B0 \(rank 1\)"):
        simulate(g)


def test_p2p_time_is_alpha_beta_on_the_right_link():
    hw = load_profile("h100-sxm")
    # tp 8 fills a node, so the two stages sit on two nodes (InfiniBand); tp 1 keeps them in one
    # node (NVLink).
    for tp, link, bw in ((8, hw.inter_node, hw.nic_bandwidth_per_gpu_bytes_per_s),
                         (1, hw.intra_node, hw.intra_node.peer_bandwidth_bytes_per_s)):
        par = ParallelConfig(pp=2, tp=tp, microbatches=1)
        run = run_schedule("gpipe", tiny_model(num_heads=8), hw, par)
        p2p = run.result.trace[run.result.trace["kind"] == "p2p"]
        assert len(p2p) == 2  # activation forward, gradient back
        nbytes = p2p["bytes"].iloc[0]
        assert nbytes == 128 * 256 * 2 / tp  # s * h * 2 bytes, sharded by sequence parallelism
        expected = link.latency_s + nbytes / (bw * link.collective_efficiency)  # achieved per-class rate
        assert (p2p["end_s"] - p2p["start_s"]).iloc[0] == pytest.approx(expected)
        assert Topology(hw, par).p2p(0, 1).link.name == link.name


def test_same_input_same_trace():
    hw = load_profile("h100-sxm")
    par = ParallelConfig(pp=4, dp=2, microbatches=8)
    a = run_schedule("1f1b", tiny_model(), hw, par).result.trace
    b = run_schedule("1f1b", tiny_model(), hw, par).result.trace
    assert a.equals(b)


def test_engine_trace_equals_the_same_rows_given_to_the_trace():
    """The engine's trace, built lazily from its columns in task order and its order of rows,
    holds the same tables (values and types) as Trace.from_rows given its rows."""
    import numpy as np

    from simtrain.trace import TRACE_COLUMNS, Trace

    hw = load_profile("h100-sxm")
    par = ParallelConfig(pp=4, tp=2, dp=2, microbatches=8)
    ours = run_schedule("1f1b", tiny_model(), hw, par).result
    assert ours.order is not None and list(ours.order) != sorted(ours.order)  # rows not in task order
    theirs = Trace.from_rows(ours.rows, ours.memory_rows)
    assert [list(map(type, r)) for r in theirs.rows] == [list(map(type, r)) for r in ours.rows]
    for name in TRACE_COLUMNS:
        mine, given = ours.columns[name], theirs.columns[name]
        assert mine.dtype == given.dtype, name
        assert np.array_equal(mine, given, equal_nan=mine.dtype != object), name
    assert ours.tasks.equals(theirs.tasks) and ours.memory.equals(theirs.memory)
    assert ours.makespan_s == theirs.makespan_s and len(ours.rows) == ours.events
