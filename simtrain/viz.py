"""Plotly views of simulated (and measured) steps: the comparison dashboard and its figures.

Input is the trace and memory DataFrames of :mod:`simtrain.engine`, :class:`Report` objects and
plain tables (sweeps, measured traces); nothing here knows about SimPy or schedules.
:func:`write_dashboard` writes one self-contained HTML file (plotly.js embedded, opens offline):

* a summary table and four bars per schedule: step time (split into the time ranks spend in each
  kind of work, in exposed communication and idle), bubble ratio, exposed communication, and
  peak memory against the HBM capacity;
* optionally a sweep: bubble ratio, tokens/s and peak memory against the swept value, one line
  per schedule;
* per schedule: a timeline (per rank a compute lane and one lane per communication stream; zoom,
  hover, microbatch labels, legend toggles per kind), memory over time per rank, and link
  utilisation (busy fraction of each link port per rank, split by the kind of traffic).

The same kind (F, B, I, W, F&B, p2p, collectives, all-to-all) has the same colour in every figure
(:data:`KIND_COLORS`). Times are shown in milliseconds, memory in GiB.
"""

from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
import plotly.graph_objects as go
from plotly.colors import sample_colorscale
from plotly.subplots import make_subplots

from .export import COMPUTE_LANE, lane_order, lanes
from .network import parse_port

if TYPE_CHECKING:  # reports are only read here; importing metrics would pull in the engine (SimPy)
    from .metrics import Report

GiB = 2**30
MS = 1e3

KIND_COLORS = {
    "F": "#4C78A8",
    "B": "#E45756",
    "I": "#F58518",
    "W": "#54A24B",
    "F&B": "#9467BD",
    "OPT": "#9D755D",
    "p2p": "#3BA3A3",
    "tp": "#E8C547",
    "dp": "#B8860B",
    "a2a": "#F28CB1",
    "dispatch": "#F28CB1",
    "combine": "#D16BA5",
    "exposed comm": "#6E6E6E",
    "idle": "#D9D9D9",
}
"""One colour per kind, the same in every figure: compute kinds, then communication
(collectives in gold shades, all-to-all in pink shades), then the two parts of idle time."""

KIND_NAMES = {
    "F": "F forward",
    "B": "B backward",
    "I": "I backward (inputs)",
    "W": "W backward (weights)",
    "F&B": "F&B overlapped pair",
    "OPT": "optimizer step",
    "p2p": "p2p send/recv",
    "tp": "TP collectives",
    "dp": "DP gradient reduce",
    "a2a": "EP all-to-all",
    "dispatch": "EP dispatch (all-to-all)",
    "combine": "EP combine (all-to-all)",
    "exposed comm": "exposed communication",
    "idle": "idle (bubble)",
}

KIND_ORDER = list(KIND_COLORS)
"""Legend and stacking order of kinds."""

SCHEDULE_COLORS = ["#1F3A5F", "#D1495B", "#00798C", "#EDAE49", "#6A4C93", "#66A182", "#8D5A97", "#3D405B"]
"""Colours of schedules in sweep lines (distinct from the kind colours' roles)."""

LINK_NAMES = {"nvlink": "NVLink", "nic": "NIC"}

TEMPLATE = "plotly_white"
FONT = dict(family="Inter, system-ui, -apple-system, Segoe UI, Roboto, sans-serif", size=12, color="#1f2430")
PLOT_CONFIG = {"displaylogo": False, "responsive": True,
               "toImageButtonOptions": {"format": "png", "scale": 2}}


@dataclass
class Panel:
    """One schedule's data for the dashboard: its report, trace and memory timeline."""

    report: Report
    trace: pd.DataFrame
    memory: pd.DataFrame


def color_of(kind: str) -> str:
    """Colour of a task kind (grey for unknown kinds)."""
    return KIND_COLORS.get(kind, "#888888")


def name_of(kind: str) -> str:
    """Legend label of a task kind."""
    return KIND_NAMES.get(kind, kind)


def _sorted_kinds(kinds) -> list[str]:
    known = {k: i for i, k in enumerate(KIND_ORDER)}
    return sorted(set(kinds), key=lambda k: (known.get(k, len(known)), k))


def _style(fig: go.Figure, title: str, height: int) -> go.Figure:
    fig.update_layout(
        template=TEMPLATE, font=FONT, height=height, title=dict(text=title, x=0.01, xanchor="left"),
        margin=dict(l=70, r=30, t=64, b=50), hoverlabel=dict(font_size=12),
    )
    return fig


def schedule_color(i: int) -> str:
    """Colour of the i-th schedule of a comparison (cycles)."""
    return SCHEDULE_COLORS[i % len(SCHEDULE_COLORS)]


# --- timelines ---------------------------------------------------------------------------------

MAX_TIMELINE_BARS = 20_000
"""Above this many tasks a timeline is drawn coarsened (see :func:`coarsen_trace`)."""


def coarsen_trace(trace: pd.DataFrame, max_bars: int = MAX_TIMELINE_BARS) -> tuple[pd.DataFrame, float]:
    """Merge the sub-operations of one action into fewer bars, so huge traces stay drawable.

    MoE steps have one task per attention block, expert wave and all-to-all wave: hundreds of
    thousands of tasks, more than a browser draws. Tasks on the same rank and lane with the same
    kind, stage and microbatch are merged when the gap between them is at most ``tol`` seconds;
    ``tol`` starts at 1/4000 of the step (below a pixel on a full-width timeline) and doubles until
    at most ``max_bars`` bars remain. A merged bar spans first start to last end and its name says
    how many tasks it holds. The trace itself (metrics, ``--trace``, ``--csv``) is never coarsened.

    Args:
        trace: the engine trace.
        max_bars: the most bars to draw.

    Returns:
        ``(trace, tol)``: the (possibly merged) trace and the gap merged in seconds (0 if unchanged).
    """
    if len(trace) <= max_bars:
        return trace, 0.0
    t = trace.assign(_lane=lanes(trace)).reset_index(drop=True)
    key_cols = ["rank", "_lane", "kind", "category", "stage", "microbatch"]
    keys = t.groupby(key_cols, dropna=False, sort=False).ngroup()
    t = t.assign(_key=keys).sort_values(["_key", "start_s"], kind="stable")
    step = float(t["end_s"].max()) or 1.0
    tol = step / 4000
    while True:
        prev_end = t.groupby("_key")["end_s"].cummax().groupby(t["_key"]).shift()
        new_block = (t["_key"] != t["_key"].shift()) | (t["start_s"] - prev_end > tol)
        blocks = new_block.cumsum()
        if blocks.iloc[-1] <= max_bars or tol > step:
            break
        tol *= 2
    g = t.groupby(blocks, sort=False)
    merged = g.agg(
        rank=("rank", "first"), stream=("stream", "first"), category=("category", "first"),
        kind=("kind", "first"), name=("name", "first"), stage=("stage", "first"),
        microbatch=("microbatch", "first"), start_s=("start_s", "min"), end_s=("end_s", "max"),
        bytes=("bytes", "sum"), peer=("peer", "first"), resources=("resources", "first"),
        _n=("name", "size"),
    )
    label = [
        n if k == 1 else (f"{int(st)}{kd}{int(mb)}: {k} tasks" if not (pd.isna(st) or pd.isna(mb)) else f"{kd}: {k} tasks")
        for n, k, st, kd, mb in zip(merged["name"], merged["_n"], merged["stage"], merged["kind"], merged["microbatch"])
    ]
    merged = merged.assign(name=label).drop(columns="_n")
    return merged.sort_values(["start_s", "rank"], kind="stable").reset_index(drop=True), tol


def timeline_figure(trace: pd.DataFrame, title: str = "", x_max_ms: float | None = None) -> go.Figure:
    """Gantt timeline: per rank a compute lane and one lane per communication stream.

    Args:
        trace: the engine trace (columns of :data:`simtrain.engine.TRACE_COLUMNS`).
        title: figure title.
        x_max_ms: right end of the time axis (share it across schedules to compare them).

    Returns:
        A figure with one bar trace per kind (clicking a legend entry hides or shows that kind),
        microbatch numbers on compute bars, hover text with name, lane, start, end, duration,
        bytes and peer; drag to zoom, double-click to reset.
    """
    fig = go.Figure()
    trace, merged_s = coarsen_trace(trace)
    if merged_s:
        title += f" (coarsened: tasks of one action less than {merged_s * MS:.2f} ms apart are one bar)"
    lane = lanes(trace)
    ranks = sorted(int(r) for r in trace["rank"].unique())
    rows: list[str] = []
    ticks: list[str] = []
    for r in ranks:
        for name in lane_order(lane[trace["rank"] == r]):
            rows.append(f"rank {r} · {name}")
            ticks.append(f"<b>rank {r}</b>" if name == COMPUTE_LANE else f"{name}  ")
    y_all = [f"rank {int(r)} · {n}" for r, n in zip(trace["rank"], lane)]
    trace = trace.assign(_y=y_all, _lane=lane)
    for kind in _sorted_kinds(trace["kind"]):
        part = trace[trace["kind"] == kind]
        compute = part["category"] == "compute"
        for is_compute in (True, False):
            rows_k = part[compute == is_compute]
            if rows_k.empty:
                continue
            dur = (rows_k["end_s"] - rows_k["start_s"]) * MS
            text = ["" if pd.isna(mb) or not is_compute else str(int(mb)) for mb in rows_k["microbatch"]]
            extra = [
                " · ".join(x for x in (
                    f"{b / 1e6:,.2f} MB" if b else "",
                    f"to rank {int(p)}" if not pd.isna(p) else "",
                ) if x)
                for b, p in zip(rows_k["bytes"], rows_k["peer"])
            ]
            custom = list(zip(rows_k["name"].astype(str), rows_k["_y"], rows_k["start_s"] * MS,
                              rows_k["end_s"] * MS, dur, extra))
            fig.add_trace(go.Bar(
                name=name_of(kind), legendgroup=kind, showlegend=is_compute or not (compute.any()),
                orientation="h", y=rows_k["_y"], x=dur, base=rows_k["start_s"] * MS,
                width=0.82 if is_compute else 0.5, marker=dict(color=color_of(kind), line=dict(width=0.4, color="white")),
                text=text, textposition="inside", insidetextanchor="middle", textangle=0,
                textfont=dict(color="white", size=10), customdata=custom,
                hovertemplate="<b>%{customdata[0]}</b><br>%{customdata[1]}<br>"
                              "%{customdata[2]:.3f} → %{customdata[3]:.3f} ms (%{customdata[4]:.3f} ms)"
                              "<br>%{customdata[5]}<extra></extra>",
            ))
    # light bands behind alternate ranks
    reversed_rows = rows[::-1]
    pos = {name: i for i, name in enumerate(reversed_rows)}
    for j, r in enumerate(ranks):
        idx = [pos[n] for n in rows if n.startswith(f"rank {r} · ")]
        if j % 2 == 0 and idx:
            fig.add_shape(type="rect", xref="paper", x0=0, x1=1, y0=min(idx) - 0.5, y1=max(idx) + 0.5,
                          fillcolor="#EEF2F8", line_width=0, layer="below")
    _style(fig, title, max(260, 22 * len(rows) + 130))
    fig.update_layout(
        barmode="overlay", bargap=0.1, uniformtext=dict(minsize=8, mode="hide"),
        legend=dict(orientation="h", yanchor="bottom", y=1.0, xanchor="right", x=1, title_text=""),
        xaxis=dict(title="time (ms)", range=[0, x_max_ms] if x_max_ms else None, showgrid=True,
                   zeroline=False),
        yaxis=dict(categoryorder="array", categoryarray=reversed_rows, tickmode="array",
                   tickvals=reversed_rows, ticktext=ticks[::-1], showgrid=False, fixedrange=False),
    )
    return fig


def memory_figure(memory: pd.DataFrame, hbm_bytes: float, title: str = "",
                  x_max_ms: float | None = None) -> go.Figure:
    """Memory per rank over the step (step lines, ranks in a sequential palette) with the HBM
    capacity as a dashed red line.

    Args:
        memory: (rank, time_s, bytes) rows of the memory timeline.
        hbm_bytes: HBM capacity of one GPU.
        title: figure title.
        x_max_ms: right end of the time axis.
    """
    fig = go.Figure()
    ranks = sorted(memory["rank"].unique())
    palette = sample_colorscale("Viridis", [i / max(1, len(ranks) - 1) * 0.9 for i in range(len(ranks))])
    end_s = float(memory["time_s"].max()) if len(memory) else 0.0
    for color, r in zip(palette, ranks):
        rows = memory[memory["rank"] == r].sort_values("time_s", kind="stable")
        x = list(rows["time_s"] * MS) + [end_s * MS]
        y = list(rows["bytes"] / GiB) + [float(rows["bytes"].iloc[-1]) / GiB]
        fig.add_trace(go.Scatter(
            x=x, y=y, mode="lines", line=dict(shape="hv", width=1.8, color=color), name=f"rank {int(r)}",
            hovertemplate=f"rank {int(r)}<br>%{{x:.3f}} ms<br>%{{y:.2f}} GiB<extra></extra>",
        ))
    fig.add_hline(y=hbm_bytes / GiB, line_dash="dash", line_color="#C0392B",
                  annotation_text=f"HBM {hbm_bytes / GiB:.0f} GiB", annotation_position="top left")
    _style(fig, title, 340)
    fig.update_layout(xaxis=dict(title="time (ms)", range=[0, x_max_ms] if x_max_ms else None),
                      yaxis=dict(title="memory (GiB)", rangemode="tozero"), legend_title_text="")
    if len(ranks) > 8:  # a long legend goes below the plot, in rows
        fig.update_layout(legend=dict(orientation="h", yanchor="top", y=-0.22, x=0), height=380,
                          margin=dict(b=110))
    return fig


def link_busy(trace: pd.DataFrame, step_s: float) -> pd.DataFrame:
    """Busy fraction of every link port, per rank and kind of traffic, derived from the trace.

    A port (engine resource ``"<link>:<rank>:<out|in>"``) is held by one task at a time, so the
    busy time of a port is the sum of the durations of the tasks that held it.

    Args:
        trace: engine trace with a ``resources`` column (comma-joined names; empty for none).
        step_s: the step time the fractions are of.

    Returns:
        DataFrame (port, rank, kind, busy_s, fraction) with port e.g. ``"NVLink out"``; empty
        when no task held a resource.
    """
    cols = ["port", "rank", "kind", "busy_s", "fraction"]
    if "resources" not in trace.columns or step_s <= 0:
        return pd.DataFrame(columns=cols)
    rows = []
    held = trace[trace["resources"].fillna("") != ""]
    for res, kind, rank, s, e in zip(held["resources"], held["kind"], held["rank"], held["start_s"], held["end_s"]):
        for name in str(res).split(","):
            parsed = parse_port(name)
            if parsed:
                port, r = f"{LINK_NAMES.get(parsed[0], parsed[0])} {parsed[2]}", parsed[1]
            else:
                port, r = name, int(rank)
            rows.append((port, r, kind, e - s))
    if not rows:
        return pd.DataFrame(columns=cols)
    df = pd.DataFrame(rows, columns=["port", "rank", "kind", "busy_s"])
    df = df.groupby(["port", "rank", "kind"], as_index=False)["busy_s"].sum()
    df["fraction"] = df["busy_s"] / step_s
    return df[cols]


def link_figure(trace: pd.DataFrame, step_s: float, title: str = "") -> go.Figure | None:
    """Stacked bars: for each link port class and rank, the fraction of the step the port is
    busy, split by the kind of traffic (colours of :data:`KIND_COLORS`). None without traffic."""
    busy = link_busy(trace, step_s)
    if busy.empty:
        return None
    ports = sorted(busy["port"].unique())
    ranks = sorted(busy["rank"].unique())
    x_port = [p for p in ports for _ in ranks]
    x_rank = [f"r{r}" for _ in ports for r in ranks]
    fig = go.Figure()
    for kind in _sorted_kinds(busy["kind"]):
        part = busy[busy["kind"] == kind].set_index(["port", "rank"])["fraction"]
        y = [float(part.get((p, r), 0.0)) for p in ports for r in ranks]
        fig.add_trace(go.Bar(
            name=name_of(kind), legendgroup=kind, x=[x_port, x_rank], y=y, marker_color=color_of(kind),
            hovertemplate=f"{name_of(kind)}<br>%{{x}}<br>busy %{{y:.1%}} of the step<extra></extra>",
        ))
    _style(fig, title, 330)
    fig.update_layout(barmode="stack", yaxis=dict(title="busy fraction of the step", tickformat=".0%",
                                                  rangemode="tozero"),
                      legend=dict(orientation="h", yanchor="bottom", y=1.0, xanchor="right", x=1),
                      bargap=0.15)
    return fig


# --- comparison across schedules ---------------------------------------------------------------

def time_breakdown(panel: Panel) -> dict[str, float]:
    """Where a rank's step goes, in seconds, averaged over ranks: busy time per compute kind,
    exposed communication, and the rest of the idle time. The values add up to the step time."""
    report, trace = panel.report, panel.trace
    n = max(1, len(report.peak_memory_bytes))
    comp = trace[trace["category"] == "compute"]
    out = ((comp["end_s"] - comp["start_s"]).groupby(comp["kind"]).sum() / n).to_dict()
    busy = sum(out.values())
    out["exposed comm"] = report.exposed_comm_s
    out["idle"] = max(0.0, report.step_time_s - busy - report.exposed_comm_s)
    return out


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
        for kind in _sorted_kinds(k for b in breakdowns for k in b):
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
    _style(fig, "schedules compared", 400)
    fig.update_layout(barmode="stack", legend=dict(orientation="h", yanchor="top", y=-0.12, x=0),
                      margin=dict(b=90))
    return fig


def sweep_figure(rows: pd.DataFrame, field: str, pp: int | None = None) -> go.Figure:
    """Bubble ratio, tokens/s and peak memory against a swept parameter, one line per schedule.

    Args:
        rows: one row per (schedule, value) with columns ``schedule``, ``value``,
            ``bubble_ratio``, ``tokens_per_s``, ``peak_memory_bytes`` (worst rank), ``hbm_bytes``
            and ``error`` (None, or why that point could not be simulated: it is left out).
        field: the swept parameter (``microbatches``, ``pp``, ``vp`` ...).
        pp: pipeline ranks; with ``field == "microbatches"`` the figure adds the GPipe/1F1B
            formula (p-1)/(m+p-1) (GPipe, Huang et al. 2019, §2.3; bubble over makespan) as a
            dashed reference line.
    """
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.08, subplot_titles=(
        "bubble ratio", "throughput (tokens/s)", "peak memory (GiB, worst rank)"))
    ok = rows[rows["error"].isna()] if "error" in rows else rows
    values = sorted(rows["value"].unique())
    for i, (schedule, part) in enumerate(ok.groupby("schedule", sort=False)):
        part = part.sort_values("value")
        color = schedule_color(i)
        dash = ("solid", "dash", "dot", "dashdot")[i % 4]  # coinciding lines stay visible
        symbol = ("circle", "diamond", "square", "triangle-up", "x", "star")[i % 6]
        for col, y, fmt in ((1, part["bubble_ratio"], ".1%"), (2, part["tokens_per_s"], ",.0f"),
                            (3, part["peak_memory_bytes"] / GiB, ".1f")):
            fig.add_trace(go.Scatter(
                x=part["value"], y=y, mode="lines+markers", name=schedule, legendgroup=schedule,
                showlegend=col == 1, line=dict(color=color, width=2.2, dash=dash),
                marker=dict(size=9 - 2 * (i % 2), symbol=symbol),
                hovertemplate=f"{schedule}<br>{field} = %{{x}}<br>%{{y:{fmt}}}<extra></extra>",
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
    _style(fig, f"sweep over {field}", 400)
    fig.update_layout(legend=dict(orientation="h", yanchor="top", y=-0.18, x=0), margin=dict(b=100))
    return fig


# --- measured vs simulated ---------------------------------------------------------------------

def overlay_figure(measured: pd.DataFrame, simulated: pd.DataFrame, title: str = "") -> go.Figure:
    """One timeline with, per rank, the measured lane above the simulated lane(s).

    Args:
        measured: measured actions (columns of the engine trace; see :mod:`simtrain.measured`).
        simulated: the engine trace of the same schedule.
        title: figure title.

    Returns:
        A figure whose rows are ``rank r · measured`` (compute actions, with torch's send/recv
        and other actions as thin bars) and ``rank r · simulated`` (compute) and, when there is
        simulated communication, ``rank r · simulated comm``. One legend entry per kind toggles
        that kind in both.
    """
    data = []
    for source, df in (("measured", measured), ("simulated", simulated)):
        if df.empty:
            continue
        lane = df["category"].map(lambda c, s=source: s if c == "compute" or s == "measured" else f"{s} comm")
        data.append(df.assign(_y=[f"rank {int(r)} · {ln}" for r, ln in zip(df["rank"], lane)], _src=source))
    both = pd.concat(data, ignore_index=True)
    ranks = sorted(int(r) for r in both["rank"].unique())
    rows = []
    for r in ranks:
        for ln in ("measured", "simulated", "simulated comm"):
            if (both["_y"] == f"rank {r} · {ln}").any():
                rows.append(f"rank {r} · {ln}")
    fig = go.Figure()
    shown: set[str] = set()
    for kind in _sorted_kinds(both["kind"]):
        for source in ("measured", "simulated"):
            for is_compute in (True, False):
                part = both[(both["kind"] == kind) & (both["_src"] == source) & ((both["category"] == "compute") == is_compute)]
                if part.empty:
                    continue
                dur = (part["end_s"] - part["start_s"]) * MS
                fig.add_trace(go.Bar(
                    name=name_of(kind), legendgroup=kind, showlegend=kind not in shown, orientation="h",
                    y=part["_y"], x=dur, base=part["start_s"] * MS, width=0.8 if is_compute else 0.35,
                    marker=dict(color=color_of(kind), opacity=1.0 if source == "measured" else 0.75,
                                line=dict(width=0.4, color="white")),
                    text=["" if pd.isna(mb) or not is_compute else str(int(mb)) for mb in part["microbatch"]],
                    textposition="inside", insidetextanchor="middle", textangle=0, textfont=dict(color="white", size=10),
                    customdata=list(zip(part["name"].astype(str), part["_y"], part["start_s"] * MS, part["end_s"] * MS, dur)),
                    hovertemplate="<b>%{customdata[0]}</b><br>%{customdata[1]}<br>%{customdata[2]:.3f} → "
                                  "%{customdata[3]:.3f} ms (%{customdata[4]:.3f} ms)<extra></extra>",
                ))
                shown.add(kind)
    reversed_rows = rows[::-1]
    _style(fig, title, max(260, 30 * len(rows) + 140))
    fig.update_layout(barmode="overlay", uniformtext=dict(minsize=8, mode="hide"),
                      legend=dict(orientation="h", yanchor="bottom", y=1.0, xanchor="right", x=1),
                      xaxis_title="time since the first action (ms)",
                      yaxis=dict(categoryorder="array", categoryarray=reversed_rows))
    return fig


def difference_figure(diffs: pd.DataFrame) -> go.Figure:
    """Per action, measured minus simulated: duration (top) and start time (bottom), in ms.

    Args:
        diffs: rows of :func:`simtrain.overlay.action_differences` (``label``, ``kind``,
            ``duration_diff_s``, ``start_diff_s``), in measured start order.
    """
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08, subplot_titles=(
        "duration: measured − simulated (ms)", "start: measured − simulated (ms)"))
    for kind in _sorted_kinds(diffs["kind"]):
        part = diffs[diffs["kind"] == kind]
        for row, col in ((1, "duration_diff_s"), (2, "start_diff_s")):
            fig.add_trace(go.Bar(
                x=part["label"], y=part[col] * MS, name=name_of(kind), legendgroup=kind, showlegend=row == 1,
                marker_color=color_of(kind), hovertemplate="%{x}<br>%{y:+.3f} ms<extra></extra>"), row=row, col=1)
    fig.update_xaxes(categoryorder="array", categoryarray=list(diffs["label"]), tickangle=-60, tickfont_size=9)
    _style(fig, "per-action differences", 520)
    fig.update_layout(barmode="relative", legend=dict(orientation="h", yanchor="bottom", y=1.04, xanchor="right", x=1))
    return fig


# --- the page ----------------------------------------------------------------------------------

_STYLE = """
:root { --ink:#1f2430; --muted:#5c6475; --line:#e3e7ee; --card:#ffffff; --bg:#f4f6f9; --accent:#1F3A5F; }
* { box-sizing: border-box; }
body { font-family: Inter, system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 0;
       color: var(--ink); background: var(--bg); }
header { background: var(--accent); color: white; padding: 22px 32px 16px; }
header h1 { font-size: 24px; margin: 0 0 6px; font-weight: 650; letter-spacing: .2px; }
header p { margin: 2px 0; color: #d7dfeb; font-size: 13.5px; max-width: 1200px; }
nav { position: sticky; top: 0; z-index: 10; background: white; border-bottom: 1px solid var(--line);
      padding: 8px 32px; font-size: 13px; }
nav a { color: var(--accent); text-decoration: none; margin-right: 18px; font-weight: 550; }
nav a:hover { text-decoration: underline; }
main { padding: 18px 32px 40px; max-width: 1500px; }
section { background: var(--card); border: 1px solid var(--line); border-radius: 10px;
          padding: 14px 18px; margin: 16px 0; box-shadow: 0 1px 2px rgba(20,30,50,.04); }
section h2 { font-size: 17px; margin: 4px 0 8px; }
section p.note { color: var(--muted); font-size: 12.5px; margin: 0 0 6px; }
.kinds { display: flex; flex-wrap: wrap; gap: 6px 16px; font-size: 12.5px; color: var(--muted); margin: 6px 0 2px; }
.kinds span.chip { display: inline-block; width: 12px; height: 12px; border-radius: 3px; margin-right: 5px;
                   vertical-align: -2px; }
table.summary { border-collapse: collapse; width: 100%; font-size: 13.5px; font-variant-numeric: tabular-nums; }
table.summary th { text-align: right; color: var(--muted); font-weight: 600; padding: 6px 10px;
                   border-bottom: 2px solid var(--line); white-space: nowrap; }
table.summary td { text-align: right; padding: 6px 10px; border-bottom: 1px solid var(--line); }
table.summary th:first-child, table.summary td:first-child { text-align: left; font-weight: 600; }
table.summary tr:hover td { background: #f7f9fc; }
td.best { color: #11734b; font-weight: 650; }
td.bad { color: #C0392B; font-weight: 650; }
.grid2 { display: grid; grid-template-columns: 1fr 1fr; gap: 12px; }
@media (max-width: 1100px) { .grid2 { grid-template-columns: 1fr; } }
"""


def kinds_legend_html(kinds) -> str:
    """HTML chips naming the colour of each kind present."""
    chips = [f"<span><span class='chip' style='background:{color_of(k)}'></span>{html.escape(name_of(k))}</span>"
             for k in _sorted_kinds(kinds)]
    return f"<div class='kinds'>{''.join(chips)}</div>"


def summary_table_html(reports: list[Report]) -> str:
    """An HTML table of the headline numbers, one row per schedule; the best step time, bubble,
    exposed communication and peak memory are marked, configurations that overflow HBM are red."""
    head = ("schedule", "step time (ms)", "bubble", "span bubble", "exposed comm (ms)", "overlap", "peak memory (GiB)",
            "fits in HBM", "peak in-flight", "MFU", "tokens/s")
    ep = any(r.a2a_s > 0 for r in reports)
    if ep:
        head += ("all-to-all (ms)", "exposed all-to-all (ms)", "EP share", "link utilisation")

    def best(values):
        return min(values) if values else None

    b_step = best([r.step_time_s for r in reports])
    b_bub = best([r.bubble_ratio for r in reports])
    b_exp = best([r.exposed_comm_s for r in reports])
    b_mem = best([max(r.peak_memory_bytes) for r in reports])
    multi = len(reports) > 1
    rows = []
    for r in reports:
        peak = max(r.peak_memory_bytes)
        cells = [
            (r.schedule, ""),
            (f"{r.step_time_s * MS:,.2f}", "best" if multi and math.isclose(r.step_time_s, b_step) else ""),
            (f"{r.bubble_ratio:.1%}", "best" if multi and math.isclose(r.bubble_ratio, b_bub) else ""),
            (f"{r.span_bubble_ratio:.1%}", ""),
            (f"{r.exposed_comm_s * MS:,.2f}", "best" if multi and math.isclose(r.exposed_comm_s, b_exp) else ""),
            ("–" if r.overlap_ratio is None else f"{r.overlap_ratio:.1%}", ""),
            (f"{peak / GiB:.1f} / {r.hbm_bytes / GiB:.0f}",
             "bad" if not r.fits_in_hbm else ("best" if multi and math.isclose(peak, b_mem) else "")),
            ("yes" if r.fits_in_hbm else "NO", "" if r.fits_in_hbm else "bad"),
            (str(max(r.peak_inflight_microbatches)), ""),
            ("–" if r.mfu is None else f"{r.mfu:.1%}", ""),
            (f"{r.tokens_per_s:,.0f}", ""),
        ]
        if ep:
            links = ", ".join(f"{k} {v:.0%}" for k, v in (r.link_utilisation or {}).items())
            cells += [(f"{r.a2a_s * MS:,.2f}", ""), (f"{r.exposed_a2a_s * MS:,.2f}", ""), (f"{r.ep_share:.1%}", ""),
                      (links, "")]
        rows.append("<tr>" + "".join(f"<td class='{c}'>{html.escape(v)}</td>" for v, c in cells) + "</tr>")
    header = "<tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>"
    return f"<table class='summary'>{header}{''.join(rows)}</table>"


def sweep_table_html(rows: pd.DataFrame, field: str) -> str:
    """An HTML table of a sweep: one row per (value, schedule)."""
    head = (field, "schedule", "step time (ms)", "bubble", "tokens/s", "peak memory (GiB)", "fits in HBM")
    out = []
    for _, r in rows.sort_values(["value"], kind="stable").iterrows():
        if isinstance(r.get("error"), str):
            cells = [(str(r["value"]), ""), (r["schedule"], ""), (f"not simulated: {r['error']}", "bad")]
            out.append("<tr>" + "".join(f"<td class='{c}'>{html.escape(v)}</td>" for v, c in cells[:2])
                       + f"<td class='bad' colspan='5' style='text-align:left'>{html.escape(cells[2][0])}</td></tr>")
            continue
        cells = [
            (str(r["value"]), ""), (r["schedule"], ""), (f"{r['step_time_s'] * MS:,.2f}", ""),
            (f"{r['bubble_ratio']:.1%}", ""), (f"{r['tokens_per_s']:,.0f}", ""),
            (f"{r['peak_memory_bytes'] / GiB:.1f}", "" if r["fits_in_hbm"] else "bad"),
            ("yes" if r["fits_in_hbm"] else "NO", "" if r["fits_in_hbm"] else "bad"),
        ]
        out.append("<tr>" + "".join(f"<td class='{c}'>{html.escape(v)}</td>" for v, c in cells) + "</tr>")
    header = "<tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>"
    return f"<table class='summary'>{header}{''.join(out)}</table>"


@dataclass
class Sweep:
    """A sweep to draw: ``rows`` as :func:`sweep_figure` takes them, the swept ``field`` and
    the pipeline ranks ``pp`` (for the formula line of a microbatch sweep)."""

    rows: pd.DataFrame
    field: str
    pp: int | None = None


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-") or "x"


def dashboard_figures(panels: list[Panel], sweep: Sweep | None = None) -> list[tuple[str, str, go.Figure]]:
    """Every figure of the dashboard, in page order, as (section id, heading, figure)."""
    reports = [p.report for p in panels]
    figs: list[tuple[str, str, go.Figure]] = []
    if sweep is not None:
        figs.append(("sweep", f"sweep over {sweep.field}", sweep_figure(sweep.rows, sweep.field, sweep.pp)))
    if panels:
        figs.append(("compare", "schedules compared", comparison_figure(reports, [time_breakdown(p) for p in panels])))
    x_max = max((r.step_time_s for r in reports), default=0.0) * MS * 1.01 or None
    for p in panels:
        name = p.report.schedule
        sid = f"s-{_slug(name)}"
        figs.append((sid, f"{name}: timeline", timeline_figure(p.trace, f"{name}: timeline", x_max)))
        figs.append((sid, f"{name}: memory per rank",
                     memory_figure(p.memory, p.report.hbm_bytes, f"{name}: memory per rank", x_max)))
        link = link_figure(p.trace, p.report.step_time_s, f"{name}: link utilisation")
        if link is not None:
            figs.append((sid, f"{name}: link utilisation", link))
    return figs


def _page(title: str, meta: list[str], nav: list[tuple[str, str]], body: list[str]) -> str:
    links = "".join(f"<a href='#{i}'>{html.escape(t)}</a>" for i, t in nav)
    metas = "".join(f"<p>{html.escape(m)}</p>" for m in meta if m)
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><meta name='generator' content='simtrain'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>"
        f"<header><h1>{html.escape(title)}</h1>{metas}</header><nav>{links}</nav><main>"
        + "\n".join(body) + "</main></body></html>"
    )


def _manifest(traces: dict[str, int]) -> str:
    """A JSON script block naming each figure's div and its number of traces (for checks)."""
    return ("<script type='application/json' id='simtrain-manifest'>"
            + json.dumps({"figures": traces}) + "</script>")


def _figure_html(fig: go.Figure, div_id: str, first: bool) -> str:
    return fig.to_html(full_html=False, include_plotlyjs=first, div_id=div_id, config=PLOT_CONFIG)


def write_dashboard(path: Path, panels: list[Panel], title: str, subtitle: str = "", source: str = "",
                    sweep: Sweep | None = None) -> Path:
    """Write the comparison dashboard as one self-contained HTML file (plotly.js embedded).

    Args:
        path: HTML file to write (parent folders are created).
        panels: one :class:`Panel` per schedule (the comparison at the scenario's own settings).
        title, subtitle: page heading and a line of context (model, hardware, parallelism).
        source: where the setting comes from (shown under the heading).
        sweep: an optional :class:`Sweep`, drawn above the comparison.

    Returns:
        The path written.
    """
    reports = [p.report for p in panels]
    figs = dashboard_figures(panels, sweep)
    kinds = set().union(*(set(p.trace["kind"]) for p in panels)) if panels else set()
    nav = []
    body = []
    if sweep is not None:
        nav.append(("sweep", f"sweep over {sweep.field}"))
    nav.append(("summary", "summary"))
    nav += [(f"s-{_slug(p.report.schedule)}", p.report.schedule) for p in panels]
    first = True
    sections: dict[str, list[str]] = {}
    for i, (sid, _heading, fig) in enumerate(figs):
        sections.setdefault(sid, []).append(_figure_html(fig, f"fig-{i}", first))
        first = False
    body.append(_manifest({f"fig-{i}": len(fig.data) for i, (_s, _h, fig) in enumerate(figs)}))
    if sweep is not None:
        body.append("<section id='sweep'><h2>Sweep over " + html.escape(sweep.field) + "</h2>"
                    "<p class='note'>One line per schedule; points that could not be simulated are left out "
                    "(see the table).</p>" + "".join(sections.get("sweep", []))
                    + sweep_table_html(sweep.rows, sweep.field) + "</section>")
    if panels:
        note = ("Step time is split, per rank on average, into compute by kind, communication the rank waits on "
                "(exposed), and the rest of the idle time. Bubble = 1 − compute-busy / (ranks × step time).")
        body.append("<section id='summary'><h2>Summary</h2>" + summary_table_html(reports)
                    + kinds_legend_html(kinds | {"exposed comm", "idle"}) + "</section>")
        body.append(f"<section id='compare'><p class='note'>{html.escape(note)}</p>"
                    + "".join(sections.get("compare", [])) + "</section>")
    for p in panels:
        sid = f"s-{_slug(p.report.schedule)}"
        body.append(f"<section id='{sid}'><h2>{html.escape(p.report.schedule)}</h2>"
                    "<p class='note'>Drag to zoom, double-click to reset; click a legend entry to hide a kind. "
                    "Numbers on bars are microbatches.</p>" + "".join(sections.get(sid, [])) + "</section>")
    page = _page(title, [subtitle, f"Source: {source}" if source else ""], nav, body)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page)
    return path


def write_overlay(path: Path, measured: pd.DataFrame, simulated: pd.DataFrame, diffs: pd.DataFrame,
                  summary: dict, title: str, subtitle: str = "") -> Path:
    """Write the measured-vs-simulated page: a summary, the overlaid timeline, per-action
    differences and their table.

    Args:
        path: HTML file to write.
        measured: measured actions (see :mod:`simtrain.measured`).
        simulated: the engine trace of the simulated step.
        diffs: :func:`simtrain.overlay.action_differences`.
        summary: :func:`simtrain.overlay.overlay_summary` (seconds).
        title, subtitle: heading and context line.

    Returns:
        The path written.
    """
    span = summary
    rows = "".join(
        f"<tr><td>{html.escape(k)}</td><td>{v['measured_s'] * MS:,.3f}</td><td>{v['simulated_s'] * MS:,.3f}</td>"
        f"<td>{v['mean_abs_diff_s'] * MS:,.3f}</td><td>{v['count']}</td></tr>"
        for k, v in span["per_kind"].items()
    )
    table = ("<table class='summary'><tr><th>kind</th><th>mean measured (ms)</th><th>mean simulated (ms)</th>"
             "<th>mean |difference| (ms)</th><th>actions</th></tr>" + rows + "</table>")
    head = (f"<p class='note'>Measured step (first to last action): {span['measured_span_s'] * MS:,.3f} ms; "
            f"simulated: {span['simulated_span_s'] * MS:,.3f} ms "
            f"({span['span_error']:+.1%}). Matched {span['matched']} actions.</p>")
    figs = [overlay_figure(measured, simulated, "measured vs simulated, rank by rank")]
    if not diffs.empty:
        figs.append(difference_figure(diffs))
    body = [f"<section id='summary'><h2>Summary</h2>{head}{table}"
            f"{kinds_legend_html(set(measured['kind']) | set(simulated['kind']))}</section>",
            _manifest({f"fig-{i}": len(f.data) for i, f in enumerate(figs)})]
    body.append("<section id='timeline'>" + _figure_html(figs[0], "fig-0", True) + "</section>")
    if len(figs) > 1:
        body.append("<section id='differences'>" + _figure_html(figs[1], "fig-1", False) + "</section>")
    page = _page(title, [subtitle], [("summary", "summary"), ("timeline", "timeline"),
                                     ("differences", "differences")], body)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page)
    return path
