"""Figures across schedules: the four-panel comparison and the sweep lines."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .style import MEMORY_COLORS, GiB, MS, color_of, name_of, schedule_color, sorted_kinds, style_figure

if TYPE_CHECKING:
    from ..metrics import Report

def comparison_figure(reports: list[Report], breakdowns: list[dict[str, float]] | None = None) -> go.Figure:
    """Four panels, one bar per schedule: step time (stacked by where the time goes when
    ``breakdowns`` are given), bubble ratio, exposed communication (split into the EP all-to-all
    and the rest when a schedule has all-to-all), peak memory with the HBM line.

    Args:
        reports: one per schedule.
        breakdowns: :func:`time_breakdown` of each schedule (same order), or None for plain bars.
    """
    names = [r.schedule for r in reports]
    fig = make_subplots(rows=1, cols=4, horizontal_spacing=0.07, subplot_titles=(
        "step time (ms) — where it goes", "bubble ratio", "exposed communication (ms)", "peak memory (GiB)"))
    if breakdowns:
        for kind in sorted_kinds(k for b in breakdowns for k in b):
            y = [b.get(kind, 0.0) * MS for b in breakdowns]
            if not any(y):
                continue
            fig.add_trace(go.Bar(x=names, y=y, name=name_of(kind), legendgroup=kind, marker_color=color_of(kind),
                                 hovertemplate=f"%{{x}}<br>{name_of(kind)}: %{{y:.2f}} ms per rank<extra></extra>"),
                          row=1, col=1)
        fig.add_trace(go.Scatter(
            x=names, y=[r.step_time_s * MS for r in reports], mode="text", showlegend=False,
            text=[f"{r.step_time_s * MS:,.0f}" for r in reports], textposition="top center",
            hoverinfo="skip"), row=1, col=1)
    else:
        fig.add_trace(go.Bar(x=names, y=[r.step_time_s * MS for r in reports], marker_color="#4F5D75",
                             showlegend=False), row=1, col=1)
    neutral = "#4F5D75"
    fig.add_trace(go.Bar(x=names, y=[r.bubble_ratio for r in reports], marker_color=neutral, showlegend=False,
                         text=[f"{r.bubble_ratio:.1%}" for r in reports], textposition="outside",
                         hovertemplate="%{x}<br>bubble %{y:.2%}<extra></extra>"), row=1, col=2)
    if any(r.a2a_s > 0 for r in reports):  # the all-to-all is part of the communication
        fig.add_trace(go.Bar(x=names, y=[r.exposed_a2a_s * MS for r in reports], marker_color=color_of("a2a"),
                             name=f"exposed {name_of('a2a')}", legendgroup="a2a",
                             hovertemplate="%{x}<br>exposed all-to-all %{y:.2f} ms<extra></extra>"), row=1, col=3)
        fig.add_trace(go.Bar(x=names, y=[(r.exposed_comm_s - r.exposed_a2a_s) * MS for r in reports],
                             marker_color=neutral, showlegend=False,
                             text=[f"{r.exposed_comm_s * MS:,.1f}" for r in reports], textposition="outside",
                             hovertemplate="%{x}<br>other exposed communication %{y:.2f} ms<extra></extra>"),
                      row=1, col=3)
    else:
        fig.add_trace(go.Bar(x=names, y=[r.exposed_comm_s * MS for r in reports], marker_color=neutral,
                             showlegend=False, text=[f"{r.exposed_comm_s * MS:,.1f}" for r in reports],
                             textposition="outside", hovertemplate="%{x}<br>%{y:.2f} ms<extra></extra>"),
                      row=1, col=3)
    peaks = [max(r.peak_memory_bytes) / GiB for r in reports]
    if all(r.memory_breakdown_bytes for r in reports):
        _memory_stack(fig, reports, names, col=4)
    else:
        fig.add_trace(go.Bar(x=names, y=peaks, showlegend=False, text=[f"{p:.1f}" for p in peaks],
                             textposition="outside",
                             marker_color=[neutral if r.fits_in_hbm else "#C0392B" for r in reports],
                             hovertemplate="%{x}<br>peak %{y:.2f} GiB (worst rank)<extra></extra>"), row=1, col=4)
    if reports:
        hbm = reports[0].hbm_bytes / GiB
        fig.add_hline(y=hbm, line_dash="dash", line_color="#C0392B", row=1, col=4,
                      annotation_text=f"HBM {hbm:.0f}", annotation_position="top left")
        fig.update_yaxes(range=[0, max(peaks + [hbm]) * 1.18], row=1, col=4)
        fig.update_yaxes(range=[0, max(max(r.bubble_ratio for r in reports) * 1.25, 0.05)], tickformat=".0%",
                         row=1, col=2)
        fig.update_yaxes(range=[0, max(max(r.step_time_s for r in reports) * MS * 1.15, 1e-9)], row=1, col=1)
        top = max(r.exposed_comm_s for r in reports) * MS
        fig.update_yaxes(range=[0, top * 1.25 if top > 0 else 1], row=1, col=3)
    style_figure(fig, "schedules compared", 470)
    # full names, tilted so that six of them fit under a quarter-width panel; the legend (two rows
    # with the memory parts) sits between the title, pinned to the top, and the panels, so it
    # covers neither the title nor the labels
    fig.update_xaxes(tickangle=-40, automargin=True, tickfont=dict(size=11))
    fig.update_layout(barmode="stack", legend=dict(orientation="h", yanchor="bottom", y=1.12, x=0),
                      title=dict(yref="container", y=0.985, yanchor="top"), margin=dict(t=150), height=510)
    return fig


def _memory_stack(fig: go.Figure, reports: list[Report], names: list[str], col: int) -> None:
    """The worst rank's memory of each schedule stacked by part (weights, gradients, optimizer
    states, activations, W-pending, buffers, allocator reserve; :mod:`simtrain.memory`)."""
    worst = [max(r.memory_breakdown_bytes, key=lambda p: sum(p.values())) for r in reports]
    for part in worst[0]:
        y = [w[part] / GiB for w in worst]
        if not any(y):
            continue
        label = part.replace("_", " ")
        fig.add_trace(go.Bar(x=names, y=y, name=label, legendgroup=f"mem:{part}", marker_color=MEMORY_COLORS[part],
                             hovertemplate=f"%{{x}}<br>{label}: %{{y:.2f}} GiB (worst rank)<extra></extra>"),
                      row=1, col=col)
    totals = [sum(w.values()) / GiB for w in worst]
    fig.add_trace(go.Scatter(x=names, y=totals, mode="text", showlegend=False, text=[f"{t:.1f}" for t in totals],
                             textposition="top center", hoverinfo="skip"), row=1, col=col)


def sweep_figure(rows: pd.DataFrame, field: str, pp: int | None = None) -> go.Figure:
    """Bubble ratio, tokens/s and peak memory against a swept parameter, one line per schedule.

    Args:
        rows: one row per (schedule, value) with columns ``schedule``, ``value``,
            ``bubble_ratio``, ``tokens_per_s``, ``peak_memory_bytes_max`` (worst rank), ``hbm_bytes``,
            ``gpus``, ``tokens_per_s_per_gpu``, ``mfu`` (tokens/s per GPU is drawn when ``gpus`` varies)
            and ``error_message`` (None, or why that point could not be simulated: it is left out).
        field: the swept parameter (``microbatches``, ``pp``, ``vp`` ...).
        pp: pipeline ranks; with ``field == "microbatches"`` the figure adds the GPipe/1F1B
            formula (p-1)/(m+p-1) (GPipe, Huang et al. 2019, §2.3; bubble over makespan) as a
            dashed reference line.
    """
    ok = rows[rows["error_message"].isna()] if "error_message" in rows else rows
    per_gpu = "gpus" in ok and ok["gpus"].nunique() > 1  # a pp/tp/dp sweep: compare per GPU
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.08, subplot_titles=(
        "bubble ratio", "throughput per GPU (tokens/s/GPU)" if per_gpu else "throughput (tokens/s)",
        "peak memory (GiB, worst rank)"))
    values = sorted(rows["value"].unique())
    for i, (schedule, part) in enumerate(ok.groupby("schedule", sort=False)):
        part = part.sort_values("value")
        color = schedule_color(i)
        dash = ("solid", "dash", "dot", "dashdot")[i % 4]  # coinciding lines stay visible
        symbol = ("circle", "diamond", "square", "triangle-up", "x", "star")[i % 6]
        throughput = part["tokens_per_s_per_gpu"] if per_gpu else part["tokens_per_s"]
        extra = "<br>%{customdata[0]} GPUs, MFU %{customdata[1]:.1%}" if per_gpu else ""
        for col, y, fmt in ((1, part["bubble_ratio"], ".1%"), (2, throughput, ",.0f"),
                            (3, part["peak_memory_bytes_max"] / GiB, ".1f")):
            fig.add_trace(go.Scatter(
                x=part["value"], y=y, mode="lines+markers", name=schedule, legendgroup=schedule,
                showlegend=col == 1, line=dict(color=color, width=2.2, dash=dash),
                marker=dict(size=9 - 2 * (i % 2), symbol=symbol),
                customdata=part[["gpus", "mfu"]].to_numpy() if per_gpu else None,
                hovertemplate=f"{schedule}<br>{field} = %{{x}}<br>%{{y:{fmt}}}{extra}<extra></extra>",
            ), row=1, col=col)
    if field == "microbatches" and pp:
        xs = [v for v in values]
        fig.add_trace(go.Scatter(
            x=xs, y=[(pp - 1) / (m + pp - 1) for m in xs], mode="lines", name=f"(p−1)/(m+p−1), p = {pp}",
            line=dict(color="#888888", dash="dash", width=1.5),
            hovertemplate="formula<br>m = %{x}<br>%{y:.1%}<extra></extra>"), row=1, col=1)
    if len(ok):
        hbm = float(ok["hbm_bytes"].iloc[0]) / GiB
        fig.add_hline(y=hbm, line_dash="dash", line_color="#C0392B", row=1, col=3,
                      annotation_text=f"HBM {hbm:.0f}", annotation_position="top left")
    log = len(values) > 2 and min(values) > 0 and max(values) / min(values) >= 8
    fig.update_xaxes(title_text=field, type="log" if log else "linear", tickmode="array", tickvals=values)
    fig.update_yaxes(tickformat=".0%", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(rangemode="tozero", row=1, col=2)
    fig.update_yaxes(rangemode="tozero", row=1, col=3)
    style_figure(fig, f"sweep over {field}", 400)
    fig.update_layout(legend=dict(orientation="h", yanchor="top", y=-0.18, x=0), margin=dict(b=100))
    return fig
