"""Reading the charts: full schedule names on every bar-chart axis, and a legend entry (an outline
per pair) for the overlapped F&B pairs of DualPipe-style schedules."""

from __future__ import annotations

import simtrain
from simtrain.viz import comparison_figure, timeline_figure
from simtrain.viz.timeline import pair_spans

KW = dict(model="llama3-8b", hardware="h100-sxm", pp=4, microbatches=8, op_times=(1.0, 1.0, 1.0), comm=False)


def test_overlapped_pairs_have_a_legend_entry_and_one_outline_each():
    report = simtrain.simulate(schedule="dualpipev", **KW)
    paired = sum(len(a.parts) == 2 for order in report.run.schedule.orders for a in order)
    assert paired > 0
    fig = timeline_figure(report.trace)
    [outline] = [t for t in fig.data if t.name == "F&B overlapped pair"]
    assert len(outline.y) == paired == len(pair_spans(report.trace))
    assert set(outline.y) <= {f"rank {r} · compute" for r in range(4)}
    assert outline.showlegend is not False and outline.marker.color == "rgba(0,0,0,0)"
    # each outline spans its two halves: F and B of different microbatches
    for name, *_ in outline.customdata:
        f, b = name.split(" & ")
        assert "F" in f and "B" in b


def test_schedules_without_pairs_have_no_pair_entry():
    report = simtrain.simulate(schedule="1f1b", **KW)
    assert pair_spans(report.trace).empty
    assert "F&B overlapped pair" not in [t.name for t in timeline_figure(report.trace).data]


def test_comparison_axes_carry_full_names():
    names = ["gpipe", "1f1b", "interleaved-1f1b", "looped-bfs", "interleaved-zb", "dualpipev"]
    reports = simtrain.compare(schedules=names, vp=2, **KW)
    fig = comparison_figure([r.run.report for r in reports])
    for bar in (t for t in fig.data if t.type == "bar"):
        assert list(bar.x) == names
    for axis in ("xaxis", "xaxis2", "xaxis3", "xaxis4"):
        assert fig.layout[axis].automargin is True and fig.layout[axis].tickangle == -40
    assert fig.layout.legend.y > 1  # above the panels, clear of the tick labels
