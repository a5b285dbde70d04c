"""Metrics of a hand-made trace: a few rows built by hand, every expected number worked out below.

The step (seconds; rank 0 sends an activation to rank 1 over NVLink, rank 1 then reduces over a NIC):

    rank 0  compute  F0 [0, 4)          B0 [6, 9)  OPT [9, 10)
            tp               tp [3, 5)
            p2p                 p2p -> rank 1 [4, 6)   (holds nvlink:0:out and nvlink:1:in)
    rank 1  compute               F0 [5, 8)  B0 [8.5, 9.5)
            dp                                         dp [9.5, 10)   (holds nic:1:out and nic:0:in)
"""

from __future__ import annotations

import math

import pytest

from simtrain.metrics import compute_report, link_busy, link_utilisation, time_breakdown
from simtrain.trace import Trace, held_resources, parse_port

NAN = float("nan")


def _row(rank, stream, category, kind, stage, mb, start, end, nbytes=0.0, peer=NAN, resources=""):
    return (rank, stream, category, kind, f"{kind}{'' if stage is NAN else stage}", stage, mb, start, end, nbytes,
            peer, resources)


@pytest.fixture
def trace() -> Trace:
    rows = [  # deliberately not in time order: Trace.from_rows sorts by (start, rank)
        _row(1, "dp", "comm", "dp", NAN, NAN, 9.5, 10.0, 1e6, resources="nic:1:out,nic:0:in"),
        _row(0, "compute", "compute", "F", 0, 0, 0.0, 4.0),
        _row(0, "compute", "compute", "B", 0, 0, 6.0, 9.0),
        _row(0, "compute", "compute", "OPT", NAN, NAN, 9.0, 10.0),
        _row(0, "tp", "comm", "tp", 0, 0, 3.0, 5.0, 5e5),
        _row(0, "", "comm", "p2p", 0, 0, 4.0, 6.0, 2e6, peer=1, resources="nvlink:0:out,nvlink:1:in"),
        _row(1, "compute", "compute", "F", 1, 0, 5.0, 8.0),
        _row(1, "compute", "compute", "B", 1, 0, 8.5, 9.5),
    ]
    memory = [(0, 0.0, 100.0), (1, 0.0, 50.0), (0, 1.0, 300.0), (1, 5.0, 250.0), (0, 9.0, 100.0), (1, 9.5, 50.0)]
    return Trace.from_rows(rows, memory)


def _report(trace: Trace):
    return compute_report("hand", trace, hbm_bytes=280.0, model_flops_per_replica=2e3, peak_flops=1e3,
                          gpus_per_replica=2, dp=1, tokens_per_replica=100.0)


def test_trace_from_rows_sorts_and_measures_the_step(trace):
    assert trace.makespan_s == 10.0 and trace.events == 8
    assert list(trace.tasks["start_s"]) == sorted(trace.tasks["start_s"])
    assert trace.trace is trace.tasks  # the old attribute name still works


def test_busy_bubble_and_span_bubble(trace):
    r = _report(trace)
    # compute-busy: rank 0 = 4 + 3 + 1 = 8 s, rank 1 = 3 + 1 = 4 s; step 10 s: idle 2 s and 6 s
    assert r.idle_ratio == pytest.approx(1 - (8 + 4) / (2 * 10))
    assert r.idle_ratio_per_rank == pytest.approx([1 - 8 / 10, 1 - 4 / 10])
    # the pipeline bubble leaves out the exposed communication (2 s and 1.5 s, next test):
    # rank 0 waits only on communication, rank 1 is idle 6 - 1.5 = 4.5 s with nothing in flight
    assert r.bubble_time_s_per_rank == pytest.approx([0.0, 4.5])
    assert r.bubble_ratio_per_rank == pytest.approx([0.0, 0.45])
    assert r.bubble_ratio == pytest.approx((0.0 + 4.5) / (2 * 10))
    # pipeline actions only (OPT has no stage): rank 0 busy 7 s over the span [0, 9) = 9 s,
    # rank 1 busy 4 s over [5, 9.5) = 4.5 s; cost = the longest span, 9 s
    assert r.span_bubble_ratio == pytest.approx(1 - ((7 + 4) / 2) / 9)


def test_exposed_communication_and_overlap(trace):
    r = _report(trace)
    # rank 0: its communication (tp [3,5) and its p2p [4,6)) covers [3, 6) = 3 s, of which [3, 4)
    # overlaps its compute: 2 s exposed. Rank 1: the p2p it receives [4, 6) and its dp [9.5, 10)
    # cover 2.5 s, of which [5, 6) overlaps its F: 1.5 s exposed.
    assert r.exposed_comm_s_per_rank == pytest.approx([2.0, 1.5])
    assert r.exposed_comm_s == pytest.approx((2.0 + 1.5) / 2)
    assert r.comm_s == pytest.approx(3.0 + 2.5)
    assert r.overlap_ratio == pytest.approx(1 - (2.0 + 1.5) / (3.0 + 2.5))
    assert r.a2a_s == 0.0 and r.ep_share == 0.0


def test_memory_mfu_and_throughput(trace):
    r = _report(trace)
    assert r.peak_memory_bytes == [300.0, 250.0]
    assert r.fits_in_hbm is False  # 300 > 280
    assert r.peak_inflight_microbatches == [1, 1]
    assert r.mfu == pytest.approx(2e3 / (10 * 2 * 1e3))
    assert r.tokens_per_s == pytest.approx(100 / 10)


def test_link_utilisation(trace):
    util = link_utilisation(trace, 2, trace.makespan_s)
    # each NVLink port is held 2 s, each NIC port 0.5 s, out of 2 ranks x 10 s
    assert util == pytest.approx({"nic:in": 0.5 / 20, "nic:out": 0.5 / 20, "nvlink:in": 2 / 20, "nvlink:out": 2 / 20})
    assert list(util) == sorted(util)
    assert _report(trace).link_utilisation == util


def test_link_busy_per_port_rank_and_kind(trace):
    busy = link_busy(trace.tasks, trace.makespan_s)
    got = {(p, r, k): (b, f) for p, r, k, b, f in busy.itertuples(index=False)}
    assert got == {
        ("nic:in", 0, "dp"): (0.5, 0.05), ("nic:out", 1, "dp"): (0.5, 0.05),
        ("nvlink:in", 1, "p2p"): (2.0, 0.2), ("nvlink:out", 0, "p2p"): (2.0, 0.2),
    }
    assert link_busy(trace.tasks, 0.0).empty


def test_time_breakdown_adds_up_to_the_step(trace):
    r = _report(trace)
    parts = time_breakdown(r, trace.tasks)
    # per rank on average: F (4 + 3) / 2, B (3 + 1) / 2, OPT 1 / 2, exposed 1.75, the rest idle
    assert parts == pytest.approx({"F": 3.5, "B": 2.0, "OPT": 0.5, "exposed comm": 1.75, "idle": 10 - 6 - 1.75})
    assert math.isclose(sum(parts.values()), r.step_time_s)


def test_port_names():
    assert parse_port("nic:3:out") == ("nic", 3, "out")
    assert parse_port("nvlink:x:in") is None and parse_port("pool") is None
    assert held_resources(Trace.from_rows([], []).tasks) == []


def test_dashboard_link_figure_draws_the_metric(trace):
    from simtrain.viz import link_figure

    fig = link_figure(trace.tasks, trace.makespan_s)
    drawn = {bar.name: sum(bar.y) for bar in fig.data}
    assert drawn == pytest.approx({"DP gradient reduce": 0.05 + 0.05, "p2p send/recv": 0.2 + 0.2})
    assert set(fig.data[0].x[0]) <= {"NIC in", "NIC out", "NVLink in", "NVLink out"}
