"""The callback engine gives exactly the trace and memory timeline of the generator-process
engine it replaced (tests/engine_reference.py), on random graphs built to have ties: integer
durations, zero durations, shared ports, streams, stream-less transfers and processor pools."""

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
