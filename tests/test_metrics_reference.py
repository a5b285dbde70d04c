"""The vectorised metrics (one sort over the whole trace, numpy interval algebra) give bit for bit
the figures of the per-rank pandas implementation they replaced (tests/metrics_reference.py), on
random traces built to have ties, zero-length tasks, nested and touching intervals, transfers to
a peer and to oneself, and on real simulated steps (dense, MoE with Waved-EP)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simtrain.hardware import load_profile
from simtrain.metrics import _peak_inflight, _per_rank, link_utilisation
from simtrain.models import load_model
from simtrain.parallel import ParallelConfig
from simtrain.scenario import run_schedule
from simtrain.trace import Trace

from metrics_reference import per_rank_reference

PORTS = ["nvlink:0:out", "nvlink:1:in", "nic:2:out", "nic:0:in", "node"]


@st.composite
def traces(draw) -> Trace:
    ranks = draw(st.integers(1, 3))
    rows = []
    for i in range(draw(st.integers(0, 60))):
        rank = draw(st.integers(0, ranks - 1))
        start = draw(st.integers(0, 12)) / 4
        end = start + draw(st.integers(0, 6)) / 4
        if draw(st.booleans()):
            kind = draw(st.sampled_from(["F", "B", "I", "W", "F&B", "OPT"]))
            pipeline = kind != "OPT"
            stage = draw(st.integers(0, 1)) if pipeline else None  # few actions: F, B and I of one meet
            mb = draw(st.integers(0, 1)) if pipeline else None
            rows.append((rank, "compute", "compute", kind, f"t{i}", stage, mb, start, end, 0.0, None, ""))
        else:
            kind = draw(st.sampled_from(["p2p", "a2a", "tp", "dp"]))
            peer = draw(st.one_of(st.none(), st.integers(0, ranks - 1)))
            res = ",".join(draw(st.lists(st.sampled_from(PORTS), max_size=2)))
            rows.append((rank, "", "comm", kind, f"t{i}", None, None, start, end, 8.0, peer, res))
    memory = [(r, 0.0, float(r)) for r in range(ranks)]
    memory += [(draw(st.integers(0, ranks - 1)), float(t), float(draw(st.integers(0, 9)))) for t in range(5)]
    return Trace.from_rows(rows, memory)


def _check(trace: Trace) -> None:
    ref = per_rank_reference(trace)
    ranks = np.unique(trace.memory_columns["rank"])
    assert ranks.tolist() == ref["ranks"]
    new = _per_rank(trace.columns, ranks)
    for key in ("busy", "comm", "exposed", "a2a", "a2a_exposed", "span", "pipe"):
        assert [float(x) for x in new[key]] == [float(x) for x in ref[key]], key  # exact, not approximately
    assert _peak_inflight(trace.columns, ranks) == ref["inflight"]
    assert link_utilisation(trace, len(ranks), trace.makespan_s) == ref["link_utilisation"]


@settings(max_examples=150, deadline=None)
@given(traces())
def test_vectorised_metrics_equal_the_per_rank_reference(trace: Trace) -> None:
    _check(trace)


@pytest.mark.parametrize("model,schedule,par", [
    ("llama3-8b", "interleaved-1f1b", dict(pp=4, tp=2, dp=2, vp=2, microbatches=8)),
    ("llama3-8b", "zbv", dict(pp=4, tp=2, dp=2, microbatches=8)),
    ("mixtral-8x7b", "1f1b+waved-ep", dict(pp=4, dp=8, ep=8, microbatches=8, zero_stage=1)),
    ("mixtral-8x7b", "dualpipev", dict(pp=4, dp=8, ep=8, microbatches=8, zero_stage=1)),
])
def test_real_steps_match_the_reference(model, schedule, par) -> None:
    run = run_schedule(schedule, load_model(model), load_profile("h100-sxm"), ParallelConfig(**par))
    assert run.result.events > 100
    _check(run.result)
    peaks = run.result.memory.groupby("rank")["bytes"].max().tolist()
    assert run.report.peak_memory_bytes == peaks
