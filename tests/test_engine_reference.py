"""The callback engine gives exactly the trace and memory timeline of the generator-process
engine it replaced (tests/engine_reference.py), on random graphs built to have ties: integer
durations, zero durations, shared ports, streams, stream-less transfers, processor pools and
dispatch-after edges (hardware queues)."""

from __future__ import annotations

import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from simtrain.engine import TaskGraph, simulate
from simtrain.trace import TRACE_COLUMNS

from engine_reference import simulate_reference


@st.composite
def graphs(draw) -> TaskGraph:
    ranks = draw(st.integers(1, 3))
    pooled = draw(st.booleans())
    graph = TaskGraph(num_ranks=ranks, static_memory_bytes=[float(r) for r in range(ranks)],
                      pools={"node": draw(st.sampled_from([0.5, 1.0, 2.0]))} if pooled else {})
    for tid in range(draw(st.integers(1, 40))):
        rank = draw(st.integers(0, ranks - 1))
        deps = draw(st.lists(st.integers(0, tid - 1), max_size=3)) if tid else []
        graph.add(
            name=f"t{tid}", rank=rank, category="compute", kind="F",
            duration_s=float(draw(st.integers(0, 3))), deps=deps,
            stream=draw(st.sampled_from([None, "compute", "tp"])),
            resources=tuple(draw(st.lists(st.sampled_from(["a", "b", "c"]), max_size=2, unique=True))),
            mem_start=[(rank, float(draw(st.integers(0, 5))))], mem_end=[(rank, -float(draw(st.integers(0, 5))))],
            pool="node" if pooled and draw(st.booleans()) else None,
            dispatch_after=tuple(draw(st.lists(st.integers(0, tid - 1), max_size=2, unique=True))) if tid else (),
        )
    return graph


@settings(max_examples=200, deadline=None)
@given(graphs())
def test_callback_engine_equals_generator_engine(graph: TaskGraph) -> None:
    rows, mem_rows, finished = simulate_reference(graph)
    assert all(finished)  # dependencies point backwards and streams run in task order
    result = simulate(graph)
    # the same rows in the same order (sorted stably by start and rank from the order of ends)
    ref = pd.DataFrame(rows, columns=TRACE_COLUMNS).sort_values(["start_s", "rank"], kind="stable")
    assert list(map(tuple, result.trace.itertuples(index=False))) == list(map(tuple, ref.itertuples(index=False)))
    assert list(map(tuple, result.memory.itertuples(index=False))) == mem_rows


@st.composite
def contended_transfers(draw) -> TaskGraph:
    """Many stream-less transfers on few ports (long waiting queues, releases that grant several
    requests, requests in two queues at once), after a few stream tasks that release them."""
    ranks = draw(st.integers(2, 4))
    graph = TaskGraph(num_ranks=ranks)
    ports = [f"link:{r}:{d}" for r in range(ranks) for d in ("out", "in")]
    for tid in range(draw(st.integers(1, 12))):
        graph.add(name=f"c{tid}", rank=tid % ranks, category="compute", kind="F", stream="compute",
                  duration_s=float(draw(st.integers(0, 2))))
    for tid in range(len(graph.tasks), len(graph.tasks) + draw(st.integers(1, 80))):
        graph.add(name=f"x{tid}", rank=draw(st.integers(0, ranks - 1)), category="comm", kind="p2p",
                  duration_s=float(draw(st.integers(0, 3))), deps=draw(st.lists(st.integers(0, tid - 1), max_size=2)),
                  resources=tuple(draw(st.lists(st.sampled_from(ports), min_size=1, max_size=3, unique=True))))
    return graph


@settings(max_examples=60, deadline=None)
@given(contended_transfers())
def test_port_queues_grant_as_the_generator_engine_does(graph: TaskGraph) -> None:
    test_callback_engine_equals_generator_engine.hypothesis.inner_test(graph)
